// Package leakcheck finds goroutines a test binary leaves running: Main
// wraps testing.M.Run in a package's TestMain, notes the goroutines that
// exist before the tests, and after them waits a grace period for every
// goroutine started since to end. Those still running are printed with
// their stacks and fail the binary.
//
// A few goroutines outlive any test by design: ones the runtime or a
// library starts once per process on first use, such as signal
// delivery. They are ignored by the function at the top of their stack
// or the function that created them, named exactly, never by package; a
// package adds its own with options. Goroutines started before the
// tests (by package initialisers) are never reported. The etcd, gRPC
// and ZeroMQ parts kvcar runs stop all of theirs when closed, so none
// of them is ignored.
//
// It is imported by tests only; it must not import any kvcar package.
package leakcheck
