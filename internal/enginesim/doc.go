// Package enginesim emulates an xLLM engine instance, or a vLLM or SGLang
// server, over real TCP, for tests, benchmarks and local runs: its KV
// event side, its etcd
// registration, its heartbeats and an inference cost model behind its
// OpenAI request path. Each DP rank has a block cache (a Device LRU and
// an optional Host LRU), a live XPUB and a replay ROUTER, and publishes
// what its cache does exactly as the engine does: one live batch per
// operation, per-rank sequence numbers from 0, full snapshots on request.
// Fault injection reproduces
// what kvcar must survive: gaps, restarts, corrupt and oversize payloads,
// wrong ranks and block sizes, unknown parents, silently lost tails and
// misbehaving snapshots.
//
// # Cache model
//
// A prompt's full blocks are hashed into a chain with the engine's own
// seeded 64-bit hash (never kvcar's content key). Prefill reuses the
// contiguous cached prefix; a block found only on Host is loaded back to
// Device and announced as a gpu BlockStored with its tokens. The rest is
// stored on Device as one gpu BlockStored whose parent is the last reused
// block. A full Device evicts its least recently used block that is not
// part of the prompt being served; with Host offload enabled the evicted
// block is first copied to Host, announced as a tokenless cpu BlockStored
// (no tokens, no parent, block size 0), then removed from Device. A full
// Host evicts its least recently used block with a cpu BlockRemoved.
// A prompt's blocks are marked used deepest first, so the LRU tail holds
// chain leaves, as an engine frees a request's blocks in reverse.
//
// # Snapshots
//
// With Config.Replay ReplayState (the seed's engine), a replay request
// [empty, start_seq] is answered with the rank's current
// full state whatever start_seq says (R-WIRE-3): batches of at most
// SnapshotBatchBlocks blocks, parent first, each framed
// [empty, watermark, payload], then the end marker
// [empty, 0xFFFFFFFFFFFFFFFF, empty]. A Device block goes as a gpu
// BlockStored with tokens, followed, when it also has a Host copy, by a
// tokenless cpu BlockStored; a Host-only block goes as a cpu BlockStored
// with tokens. A block whose parent is on neither tier is sent with that
// parent hash anyway: an orphan, which a subscriber cannot key and must
// never report as a hit (R-IDX-5).
//
// The watermark is the sequence number of the last live message whose
// effects the snapshot includes; a subscriber applies buffered live
// messages with a greater sequence on top of it. When no live message has
// been sent since the rank started, there is no watermark to give and the
// reply is the end marker alone: that is how a subscriber learns that the
// state is empty and that every live message, from sequence 0, counts.
//
// # vLLM and SGLang modes
//
// The engine also speaks as vLLM and SGLang do (../shared/spec/DIALECTS.md):
// Config.Shape selects their encodings (upper-case and SGLang media,
// vLLM's extra fields, 32-byte sha256 hashes, signed hashes, SGLang's
// legacy arrays, a legacy 0 for a root's parent); ReplayHistory answers
// a replay with the live messages it still keeps from the requested
// sequence on, each under its own sequence, at most HistoryBatches of
// them (vLLM's buffer_steps); ReplayNone binds no replay endpoint (their
// default); ReplayTopicFrames adds the topic frame to replies and an
// empty one to the end marker (vLLM 0.26); Topic may be a per-pod topic;
// DialEvents makes each rank's publisher dial a bound subscriber at the
// given port + rank instead of binding (vLLM with a non-wildcard
// endpoint); DPRankBase tags batches with rank base+dp, as each rank of
// vLLM's external data parallelism, a server of its own, does.
// SetDropLive keeps messages in the history but off the live channel.
//
// # Registration and load reports
//
// With Config.HTTPAddr the engine serves its business HTTP address; the
// instance name is that "ip:port" unless Name says otherwise, and
// DiscoveryOffsets places the KV endpoints where kvcar's discovery derives
// them from it (R-DISC-2). GET /health answers 200 "ok", or 503 after
// SetHealthy(false): kvcar's registry probes it when a key disappears.
//
// With Config.Etcd, Start registers as an xLLM engine does: it grants a
// lease (3 s by default), puts [/<ns>/]XLLM:<TYPE>:<name> with the
// InstanceMetaInfo JSON under it and keeps it alive; Close revokes it, so
// the key disappears at once. Each process start has its own identity, a
// random incarnation_id and a growing register_ts_ms: Restart and
// RestartWithDPSize are new processes and overwrite the key under a new
// lease without deleting it, while Reregister keeps the identity. The
// faults a registry must tell apart are LoseLease (no more renewals: the
// key expires after the TTL while HTTP and heartbeats go on), Deregister
// (revoked now), SetHealthy and SetHeartbeatPaused. An engine with
// ReconcileInterval puts a missing key back by itself, as xLLM does.
//
// With Config.Heartbeat the engine reads and watches
// [/<ns>/]XLLM:SERVICE:MASTER, the master's "ip:rpc_port", and calls
// xllm_service.proto.XllmRpcService.Heartbeat there over baidu_std every
// interval, on one pipelined connection, as an xLLM engine does: its name
// and incarnation, load_metrics (always present) with
// waiting_requests_num (the requests waiting for a batch slot, plus
// SetWaiting's value) and gpu_cache_usage_perc, the Device blocks in use
// over the capacity, averaged over the DP ranks as xLLM averages them,
// and latency_metrics when SetLatency gave samples. With
// HeartbeatConfig.HTTPURL it posts the proto-JSON HeartbeatRequest to
// that HTTP intake instead, as xllm-service's vLLM sidecar does. The
// master's last answer is kept for LastHeartbeatStatus; a refusal
// (Status{ok: false}, or 409 over HTTP: unknown instance or incarnation)
// is only logged, as by xLLM.
//
// xllm-service decides a MIX instance's current role itself and keeps it
// out of etcd; SetMixRole writes it to the optional meta field
// current_type for a registry that wants to be told.
//
// # Inference requests
//
// The business HTTP address also serves the OpenAI request path kvcar
// relays to: POST /v1/completions, POST /v1/chat/completions and GET
// /v1/models, which lists one model (Config.ModelName). A completion
// prompt of token ids is served as is; a string prompt, and chat messages
// flattened by FlattenChat, go through ToyTokenize, a deterministic toy
// that hashes white-space separated words. The top-level field
// "kvcar_token_ids" (TokenIDsField) carries exact ids for either endpoint
// and replaces the prompt or messages. max_tokens (max_completion_tokens
// for chat) defaults to 16; the output is the filler "tok1 tok2 ..." and
// always ends for "length". stream gives SSE chunks, one per output token,
// then a finish chunk, a usage chunk with stream_options.include_usage,
// and "data: [DONE]". The model named is echoed (ModelName when none
// is), whatever it is. Other fields are ignored; n other than 1 and
// batched prompts are refused.
//
// The routing names arrive in the body's "routing" object
// {"prefill_name","decode_name"} or the X-Prefill-Name and X-Decode-Name
// headers, the body winning name by name. They are only recorded: the
// engine serves prefill and decode itself. Every response, and a stream's
// finish chunk, has a "kvcar_engine" object (EngineUsage) with the
// instance, the DP rank, the engine's own Device and Host hits, the
// queue, prefill and decode milliseconds and the names that arrived.
//
// Each request goes to the least loaded DP rank, running plus queued,
// ties taking turns, and waits in that rank's FIFO queue for one of its
// BatchSlots. It then prefills on the rank's cache through the same path
// as Prefill, so hits are the engine's truth and its events go out, and
// sleeps for the cost model (CostModel), all scaled by TimeScale:
// PrefillPerToken per uncached token, their attention over the context
// before them (PrefillAttentionPer1KContext) and HostLoadPerToken per
// Host-hit token, giving the first token, then DecodePerToken for each
// further one. A rank with one BatchSlot prefills one prompt at a time,
// a single FIFO server; each further slot serves another request at full
// speed alongside, so it adds a rank's worth of compute. Output tokens
// are not cached. waiting_requests_num is the number of requests waiting
// for a slot plus SetWaiting's value. A client that goes away frees its
// place at once; past MaxQueue waiting requests the answer is 503, a
// malformed request gets 400 with an OpenAI error body, and
// SetFailRequests forces a status. Restart and Close cut off the requests
// in flight by dropping their connections. Stats counts it all.
//
// # Inference requests over baidu_std
//
// The business port also serves baidu_std, told from HTTP by the PRPC
// magic as brpc tells them: xllm.proto.XllmAPIService Completions and
// ChatCompletions, as an xLLM engine serves them to xllm-service. The call
// is answered at once with an empty response; the request then runs
// through the same queues and cost model as over HTTP (its token_ids, else
// its prompt or messages tokenized as above), and its output goes to
// source_xservice_addr (else the master) as
// XllmRpcService.Generations calls: streamed, one generation per token,
// the last with the finish reason, usage and finished; unstreamed, one
// with the whole output. With routing.decode_name naming another
// instance, the prefill instance sends the first token marked
// finished_on_prefill_instance and hands the request to the decode
// instance (PDService/PDMethodDecode, an emulation-only method: xLLM's
// own engine-to-engine protocol is not reproduced), which sends the rest.
// Errors go back as an engine sends them, a generation with only
// service_req_id and gen_status: RESOURCE_EXHAUSTED past MaxQueue,
// UNAVAILABLE under SetFailRequests or when the decode instance cannot be
// reached, INVALID_ARGUMENT for a request without tokens. A generation
// the service refuses (Status{ok: false}) or cannot take stops the
// request. An xLLM engine accepts a request without prompt text when it
// has token_ids; the real one refuses it ("Prompt is empty"). The
// engine's request ids, which the output carries and the service's
// answer shows as its id, are unique across engines
// ("cmpl-<hash of the name>-<n>"), and what the prefill instance did for
// a request (the EngineUsage an HTTP answer carries, which Generations
// have no room for) is kept under that id for Served.
//
// # Ownership
//
// Each rank's sockets and cache belong to one goroutine; public methods
// hand it work through a channel and wait for the result. The HTTP
// server, the lease keepalive, the heartbeat and the reconciler each run
// in one goroutine that the Engine starts and that Close stops and waits
// for. An inference request is served by its own HTTP handler goroutine,
// which the server owns; it waits for a slot on a channel of its own and
// stops when its client or the process goes. A baidu_std request runs on
// a goroutine the business port's server owns and waits for when it
// stops, with one client connection per service or decode instance. The
// package owns no state
// outside an Engine. It imports kvevent
// only to encode, kvtransport only for the engine-side sockets, baidustd
// and xllmpb only to speak xLLM's RPCs and the etcd client only to
// register; it must not import the directory, index
// or instance packages, whose behaviour it exists to test.
package enginesim
