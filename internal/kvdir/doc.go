// Package kvdir owns the KV prefix directory: the set of event streams
// (one per engine instance and DP rank), the goroutine that keeps each
// stream's index in step with its engine (live SUB deltas, DEALER
// snapshots, gap and fault detection, bounded buffering, atomic publish,
// periodic calibration), and the read-only query view used by the HTTP
// API and the router (R-DIR, R-REC).
//
// Each stream's state changes only on that stream's goroutine; queries
// read the last published view under a read lock and never wait on the
// network. kvdir must not do HTTP or etcd I/O, and must not decide
// routing: it reports what the engines hold.
package kvdir
