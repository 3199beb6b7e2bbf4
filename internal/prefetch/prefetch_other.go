//go:build !amd64 && !arm64

package prefetch

// Addr does nothing on this architecture.
func Addr(p uintptr) {}
