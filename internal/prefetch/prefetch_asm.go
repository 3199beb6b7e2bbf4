//go:build amd64 || arm64

package prefetch

// Addr starts loading the cache line holding address p. p need not be
// valid memory.
//
//go:noescape
func Addr(p uintptr)
