// Package etcdembed runs a single-member etcd server inside the current
// process, for tests and local runs that need a real etcd: discovery,
// lease expiry, compaction and server restarts behave exactly as they do
// against a standalone etcd because it is the same server code.
//
// A Server listens on 127.0.0.1 only, on ports it picks itself, keeps its
// data in a directory of its own (a temporary one, removed on Close,
// unless Options.Dir names one) and sends its error log to a
// slog.Logger, without the errors every start and stop writes.
//
// Clients reach the server through a relay on Endpoint, so that faults
// can be injected the way they happen: Stop and Start restart the server
// on the same directory and ports (clients reconnect by themselves and
// find the same revisions and leases), Partition cuts the clients off
// while the server runs (connections close, new ones are refused: a
// failure clients see at once), and Stall black-holes them (connections
// stay open, new ones are accepted, and no byte passes either way: a
// failure clients see only by their own timeouts). Heal ends either;
// the connections a stall held are then closed, as TCP connections
// through a black hole time out in the end, while Resume ends a stall
// keeping them and delivers the bytes held back, as after a short black
// hole. DirectEndpoint bypasses the relay so that a test can change data
// meanwhile. The relay also makes Stop immediate: etcd's own shutdown
// waits for open watches for over five seconds.
//
// The raft tick is short (10 ms) so that an etcd lease can be as short
// as one second, the shortest TTL etcd grants; production code never
// depends on that.
//
// The package must not know about kvcar's keys or types: it is an etcd
// server and nothing more. It is kept apart from the registry so that
// the service binary does not link the etcd server.
package etcdembed
