// Package sockio owns raw reads and writes of TCP sockets: non-blocking
// system calls made without the scheduler's syscall state, waiting in the
// runtime's poller only when a socket cannot proceed. kvcar's request
// path (internal/server) and the relay bound of cmd/kvcar-load use it.
// It also says which accept failures a server waits out
// (AcceptRetryable), for kvcar's HTTP and baidu_std servers alike. It
// must not close connections or set their deadlines: the net.Conn's owner
// does.
package sockio
