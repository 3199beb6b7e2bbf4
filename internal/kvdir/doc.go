// Package kvdir owns the KV prefix directory: the set of event streams
// (one per engine instance and DP rank), the goroutine that keeps each
// stream's index in step with its engine, and the read-only query view
// used by the HTTP API and the router (R-DIR, R-REC).
//
// A stream follows its engine in one of three sync modes (config
// SyncMode): snapshot, the seed's engine, whose replay endpoint sends its
// full state (live SUB deltas, DEALER snapshots, gap and fault detection,
// bounded buffering, atomic publish, periodic calibration; syncer.go,
// snapshot.go); history and live, vLLM's and SGLang's, whose replay
// endpoint sends buffered batches or does not exist, so the view is built
// in sequence order from wherever it could start and may be partial
// (ordered.go). In every mode the directory may under-report and never
// over-reports. Discovery (discovery.go) derives the streams from the
// instance registry, and a hub (hub.go) serves streams whose engines dial
// one bound subscriber.
//
// Each stream's state changes only on that stream's goroutine; queries
// never wait on the network. A goroutine decodes into storage it keeps
// between messages; large storage (a snapshot's reply batches) goes back
// to a pool the Directory keeps once the goroutine has nothing left to
// decode (batchpool.go). A query walks the prompt once per key group
// (block size, seed) over the group's shared key table (keytable.go),
// which mirrors the content keys of every stream's published index as
// per-slot tier bitsets, so its cost does not grow with the number of
// streams; it then reads each stream's status from a lock-free copy. A
// large key table grows a step per write (keytable_grow.go), its new
// array made on a goroutine the Directory waits for at Close, so that no
// stream's events wait for the whole table to be rebuilt, nor for a
// gigabyte to be allocated.
// A router's query (Directory.Hits) reads only the walk's dense per-slot
// results and answers against the stream set's immutable Layout, so it
// touches no stream structure. kvdir must not do HTTP or etcd I/O, and
// must not decide routing: it reports what the engines hold.
package kvdir
