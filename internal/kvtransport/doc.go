// Package kvtransport owns the ZeroMQ sockets of the KV event channels:
// the SUB (live) and DEALER (replay) sides that kvcar uses, a SUB that
// kvcar binds for publishers that dial it, and the XPUB and ROUTER sides
// that an engine, or the engine emulator, binds (or, for a publisher that
// dials, connects). It wraps github.com/pebbe/zmq4 over libzmq so that
// the rest of the project sees frames, timeouts and link events rather
// than socket options.
//
// Every socket is used from the one goroutine that owns it. A wait parks
// that goroutine in Go's network poller (on Linux), so a process following
// many streams holds no thread per stream, asks libzmq only about the
// sockets that may have input, and libzmq's own threads run under
// SCHED_BATCH. A message is received in one call into libzmq, its
// frames copied into a buffer the socket reuses (frames.go), so a
// receive allocates nothing and its frames last until the next one; a
// buffer of 64 KiB or more goes back to a pool the Context keeps when a
// receive finds nothing queued, so that sockets taking turns with large
// messages (snapshots) share a few buffers.
// The package must not decode payloads or keep any stream state.
package kvtransport
