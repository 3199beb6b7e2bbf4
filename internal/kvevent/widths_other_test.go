//go:build !amd64 || purego

package kvevent

// archFills is empty: fillWindow is fillWindowGo here.
func archFills() map[string]func(ws, ws2 *[idChunk]byte, p []byte, n int) { return nil }
