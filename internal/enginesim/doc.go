// Package enginesim emulates the KV event side of an xLLM engine
// instance over real TCP, for tests, benchmarks and local runs. Each DP
// rank has a block cache (a Device LRU and an optional Host LRU), a live
// XPUB and a replay ROUTER, and publishes what its cache does exactly as
// the engine does: one live batch per operation, per-rank sequence
// numbers from 0, full snapshots on request. Fault injection reproduces
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
// A replay request [empty, start_seq] is answered with the rank's current
// full state whatever start_seq says (R-WIRE-3): batches of at most
// SnapshotBatchBlocks blocks, parent first, each framed
// [empty, watermark, payload], then the end marker
// [empty, 0xFFFFFFFFFFFFFFFF, empty]. A Device block goes as a gpu
// BlockStored with tokens, followed, when it also has a Host copy, by a
// tokenless cpu BlockStored; a Host-only block goes as a cpu BlockStored
// with tokens. A block whose parent is on neither tier is sent with that
// parent hash anyway: an orphan, which a subscriber must skip (R-IDX-5).
//
// The watermark is the sequence number of the last live message whose
// effects the snapshot includes; a subscriber applies buffered live
// messages with a greater sequence on top of it. When no live message has
// been sent since the rank started, there is no watermark to give and the
// reply is the end marker alone: that is how a subscriber learns that the
// state is empty and that every live message, from sequence 0, counts.
//
// # Ownership
//
// Each rank's sockets and cache belong to one goroutine; public methods
// hand it work through a channel and wait for the result. The package
// owns no state outside an Engine. It imports kvevent only to encode and
// kvtransport only for the engine-side sockets; it must not import the
// directory or index packages, whose behaviour it exists to test.
package enginesim
