// Package lb owns the routing policies selected by
// --load_balance_policy: RR, CAR and SLO_AWARE (R-CAR). A policy
// chooses, for one request, the instance that runs its prefill and the
// instance that decodes it, from an instance.Snapshot (the registry's
// immutable view: types, roles, states, loads, profiles) and, for CAR,
// the hits of the in-process KV directory.
//
// lb does no I/O of any kind: no network, no etcd, no files, no
// logging. Policies are pure functions of their arguments plus the
// little state they keep for themselves (tie and round-robin turns,
// fitted latency models), held in the policy value (with its pool
// of scratch buffers) and safe for concurrent use; there is no
// package-level mutable state. lb must not modify the snapshot or the hits,
// must not change the registry (it never flips a MIX role) and must not
// read KV metadata from anywhere but the PrefixView it is given.
//
// # Candidates (R-CAR-2)
//
// Prefill candidates are DEFAULT, PREFILL and MIX instances playing
// PREFILL; decode candidates are DECODE and MIX instances playing
// DECODE (a MIX instance joins by its current Role). SUSPECT instances
// are never candidates. CAR and SLO_AWARE also leave out instances with
// no first load report or an invalid one (Instance.LoadUsable); RR does
// not need loads, as in xllm-service, so it routes to instances before
// their first heartbeat.
//
// Only DEFAULT may serve without a decode instance. A PREFILL (or
// MIX-as-PREFILL) instance hands its KV to a decode instance of the
// same backend_type, since a KV handoff is engine-specific; one with no
// such decode candidate is not a candidate itself, so a request goes to
// a DEFAULT instance instead or fails with ErrNoCandidate saying why.
// Any backend is routed: backend_type only pairs P with D. When DEFAULT
// and PREFILL instances are both candidates they compete on the same
// score; a PREFILL winner gets a decode instance, a DEFAULT winner gets
// Decision.Decode "" (xLLM links DEFAULT instances to no decode
// instance).
//
// # CAR (R-CAR-3..8)
//
// For each prefill candidate, in floating point:
//
//	hit   = clamp((device_hit + w·host_only_hit) / input_tokens, 0, 1)
//	queue = waiting / max(waiting over the prefill candidates), 0 if all are 0
//	score = λ·(1 − hit) + (1 − λ)·queue
//
// and for each decode candidate of the winner's backend
//
//	score = gpu_cache_usage_perc + waiting / max(waiting over them), 0 if all are 0
//
// lowest wins on each side. input_tokens is len(Request.TokenIDs) (no
// ids: hit 0). A multi-DP instance's hit is the minimum over its DP
// ranks 0..dp_size−1; it is 0 when any rank has no match, is
// unsynchronised, or belongs to another incarnation than the instance's
// current one. An empty incarnation matches only an empty one, and only
// on a discovered stream: an engine registered without incarnation_id
// and register_ts_ms keeps its benefit (R-DISC-5), a static stream gets
// none (R-CAR-7).
// Without a view every hit is 0 and CAR ranks by queue. The directory is
// queried once per request into a pooled buffer, through
// PrefixView.Hits: one dense hit per stream of the directory's layout.
// Which streams decide which instance (the join of the snapshot's names,
// DP sizes and incarnations with the layout's) is kept in the policy
// between decisions and checked against each new snapshot by the
// identity of its strings, so a decision reads no names; the candidate
// scan reads the snapshot's 48-byte briefs (instance.Brief), not its
// Instances. Both keep a decision that finds the caches cold, as a
// router's sparse decisions do, to a few contiguous arrays.
//
// # Dry decisions
//
// CAR.Warm makes a dry decision: every step of Route on a prompt of
// zeros, taking no tie turn and recording nothing in the accounting, so
// that it changes no later decision. KeepWarm makes one every interval
// while real decisions are rarer than that, so that they find what they
// read in the processor's caches; its caller owns the goroutine that
// runs it and tells it of each real decision (KeepWarm.Decided).
//
// # Dispatch accounting (opt-in)
//
// Loads arrive with heartbeats (every 0.5 s by default) and KV events
// only after a prefill, so between them every request of a burst sees
// the same picture and CAR would send them all to one instance. With
// AccountingOptions.Dispatched, CAR remembers, per instance and
// incarnation, each request it routed there (time and uncached prompt
// tokens, the latter by the hit ratio it was routed with) and adds the
// requests a load report cannot include to that instance's waiting
// count in the queue term:
//
//	sent   = dispatches at t with t > LoadUpdated − HeartbeatLag and t > now − DispatchMaxAge
//	tokens = uncached prompt tokens of dispatches not yet released, t > now − DispatchMaxAge
//	queue  = (1−β)·(waiting + sent)/max(waiting + sent) + β·tokens/max(tokens)
//
// A load report supersedes every dispatch made at least HeartbeatLag
// before kvcar received it (LoadUpdated): the engine's waiting count is
// assumed to include them by then. A request that is already in
// prefill is not "waiting" to the engine, so after the next report it
// counts nowhere, as in R-CAR-3. The DP rank a request lands on is the
// engine's choice, so counts are per instance. β (TokenWeight) is 0 by
// default: the queue term stays a request count. Load reports carry no
// tokens, so they do not supersede the token part: a request's tokens
// count until the caller releases its Decision (Releaser; the request
// path does when the request ends) or DispatchMaxAge passes.
//
// With AccountingOptions.PendingPrefixes, the full blocks (of the KV
// events config's block_size) of a routed prompt are pending on the
// chosen instance until PendingTimeout: a later prompt's leading blocks
// that are pending there count as hit tokens, raising that instance's
// hit ratio to max(directory, pending). When the directory reports at
// least as much for the instance, the events have confirmed them and
// they stop being pending, so an eviction afterwards is the directory's
// to report. Pending blocks count for the whole instance, whichever DP
// rank the engine picks; they are never in the directory, so the query
// API and Decision.HitRatio (the directory's ratio) never show them.
//
// Both parts forget an instance as soon as a snapshot shows it gone,
// SUSPECT or of another incarnation, and both are bounded per instance
// (MaxPendingDispatches, MaxPendingBlocks: the oldest is forgotten).
// The states are also kept by the instances' places in the snapshot,
// placed again only when its MetaGens change, with a contiguous array of
// their sums (oldest and newest dispatch, count, live tokens) beside
// them. A decision reads a candidate's sum by its place and its load
// report's time from its brief (instance.Brief.LoadAt), and reads no
// name, no Instance, and a state and its ring of dispatches only when
// some have expired, or some are older than the load report and some
// newer.
// With either part on, CAR decisions run one at a time under a mutex,
// so each sees those before it.
//
// # Ties (R-CAR-5)
//
// Candidates whose costs are within 1e-12 of the best are tied; a
// counter in the policy value (one per side) picks among them in turn,
// so equal instances share the load and none is permanently preferred.
//
// # RR and SLO_AWARE (R-CAR-9)
//
// RR takes the prefill candidates in name order, one per request, and
// the decode candidates likewise with a separate turn. SLO_AWARE
// predicts TTFT and TPOT from the instances' profiling data with
// least-squares fits (see SLOAware, FitTTFT, FitTPOT).
package lb
