// Package instance owns the instance registry: the local view of the
// xLLM engine instances registered in etcd under the xllm-service layout,
// their runtime state (ACTIVE, LEASE_LOST, SUSPECT), their identity
// (incarnation), their load reports (heartbeats and the master's
// periodic XLLM:LOADMETRICS sync), and this service replica's own
// registration and master election (R-DISC, R-CAR-2, R-CAR-10, R-CAR-11).
//
// # Reading
//
// Snapshot returns an immutable, sorted view of every known instance
// with one atomic load: the request path and discovery read it without
// locks, waits or I/O (R-DIR-4). A snapshot and everything it points to
// must not be modified. WaitFor and Changes let a reader wait for the
// next snapshot instead of polling.
//
// A snapshot is published for every change, with one exception that
// keeps heartbeat intake cheap at a hundred engines and more: a
// heartbeat that only moves an instance's load or latency values (or
// nothing but its time) waits for the next snapshot, at most
// LoadPublishDelay, so that the heartbeats of many engines cost one
// copy of the list rather than one each. A heartbeat that changes what
// routing may do with an instance (its state, whether its load is
// usable, where the load came from) is published at once. Publishing
// copies the instances in an order kept sorted across publications; it
// sorts again only when an instance comes or goes. It also packs what the
// routing policies scan of every instance (type, role, state, load
// validity, waiting requests, backend) into the snapshot's Briefs, 32
// bytes each, so a routing decision reads a few contiguous cache lines
// rather than a line or two of each 400-byte Instance.
//
// # etcd layout
//
// Every key may carry a namespace prefix "/<ns>/". Engines write
// XLLM:{DEFAULT,PREFILL,DECODE,MIX}:<name> with a lease; the value is
// InstanceMetaInfo JSON and <name> is the business HTTP address
// "ip:port", which wins over the value's own name field. The registry
// lists and watches one key range that holds those four prefixes and
// XLLM:LOADMETRICS: and nothing else, so it never reads XLLM:CACHE:
// (R-DIR-3). A value that is not valid JSON, lacks name, rpc_address or
// type, or has a dp_size above MaxDPSize, and a key whose name is not a
// business address host:port (CheckName: IPv6 in brackets, nothing a
// URL could add), are ignored with one warning per written value naming
// the instance and the reason, and leave the instance as it was: such
// an instance is never registered, routed to or subscribed. The watch resumes by itself across
// etcd restarts; after a compaction, or any watch failure, the registry
// lists the range again and reconciles, treating a vanished key as a
// DELETE.
//
// A watch can also stall: its connection stays open and nothing arrives
// (a black-holed network path). No error reports it: gRPC's keepalive
// closes the connection only after 13 s, and the client then resumes
// the watch by itself, silently, once it can reconnect. So a watch that
// has brought nothing for WatchProgressInterval asks etcd for a
// progress notification, and one that has brought nothing, answers
// included, for WatchStallTimeout is abandoned: the stall is logged and
// counted, and the registry lists again and watches anew, on a watch
// stream of its own that ends with the abandoned watch. Meanwhile the
// last snapshot keeps serving and heartbeats keep applying; WatchState
// and the metrics say that the view is not live and how long etcd has
// been silent.
//
// # State machine
//
// A PUT of a new name registers it ACTIVE. A PUT with the same
// incarnation (incarnation_id, else register_ts_ms) refreshes the meta
// and makes the instance ACTIVE again, keeping its load, latency and
// role; a PUT with a different incarnation replaces it by a fresh
// instance with no load report yet (R-DISC-5). A DELETE starts a health
// probe (GET http://<name>/health, ProbeAttempts tries of ProbeTimeout)
// off the watch goroutine; while it runs the instance keeps its state.
// Success makes it LEASE_LOST, failure SUSPECT. LEASE_LOST without a
// heartbeat for LeaseLostGrace becomes SUSPECT; a heartbeat while
// SUSPECT makes it LEASE_LOST; SUSPECT for SuspectTimeout removes it.
// Only SUSPECT is unschedulable. A DELETE whose previous value names
// another incarnation than the current one, or of a key the instance no
// longer uses, is stale and ignored.
//
// # Roles of MIX instances
//
// xllm-service keeps a MIX instance's current role in the service only
// (InstanceMetaInfo.current_type, never written to etcd): on
// registration a MIX instance plays DECODE when no registered instance
// plays DECODE yet, and PREFILL otherwise; refreshes keep the role, and
// only the SLO_AWARE policy flips it afterwards. Instance.Role follows
// the same rule, and SetRole is the flip. Each replica decides on its
// own, so replicas may disagree, as they do in xllm-service.
//
// # Loads
//
// An instance has no load until its first report (HasLoad false). A
// heartbeat with a value out of range (gpu_cache_usage_perc NaN,
// infinite or outside [0, 1], a negative latency; Heartbeat.Validate)
// is refused whole with ErrInvalidHeartbeat: it changes no load, no
// state and no heartbeat time. A XLLM:LOADMETRICS value whose usage is
// out of range makes LoadValid false and is not stored: Load keeps the
// last valid values.
// The most recent report, by the time this replica receives it, wins:
// a heartbeat (R-CAR-10) is applied at once (and published as above),
// and a XLLM:LOADMETRICS value replaces it only when it arrives later. A
// synced value written before the instance's current incarnation
// registered is never applied. The master does not let XLLM:LOADMETRICS (its own writes)
// override a heartbeat it received, but takes the values of instances it
// has not heard from, which its predecessor wrote. Every
// LoadSyncInterval it writes the valid load of every instance there and
// deletes the entries of instances that have none (removed, replaced,
// or reporting an invalid load), in transactions that hold only while
// it holds the master key.
//
// # Service registration and election
//
// With Options.SelfAddr set, Run keeps XLLM:SERVICE:<SelfAddr> and
// competes for XLLM:SERVICE:MASTER, both created only if absent and
// bound to one lease of MasterLeaseTTL kept alive by Run. A replica that
// finds the master key taken watches it and tries again when it is
// deleted. IsMaster holds only while the lease is known alive (the TTL
// counted from the last keep-alive answer), so a master cut off from
// etcd stops acting as one before another can be elected; once the
// lease is lost the replica starts over with a new one. Run revokes the
// lease when it ends, so another replica takes over without waiting for
// the TTL. The master only writes loads; every replica watches, probes
// and routes on its own (R-CAR-11).
//
// Every call to etcd has a context: the listing and the lease and
// election calls a timeout, the registry's watch the stall timeout, the
// election's watch and the keep-alives Run's context.
//
// The package must not read or write KV cache metadata, subscribe to
// engines or decide routing: it reports which instances exist, in which
// state, with which load.
package instance
