// Package sockio owns raw reads and writes of TCP sockets: non-blocking
// system calls made without the scheduler's syscall state, waiting in the
// runtime's poller only when a socket cannot proceed; a request's write
// that starts the wait for its answer without a read that could only
// come too early; and reads into buffers taken for the read alone, so
// that a connection waiting for input holds none. kvcar's request
// path (internal/server) and the relay bound of cmd/kvcar-load use it.
// Its Accept waits out the accept failures a server should survive, for
// kvcar's HTTP and baidu_std servers alike. It
// must not close connections or set their deadlines: the net.Conn's owner
// does.
package sockio
