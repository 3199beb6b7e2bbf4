//go:build !amd64 || purego

package kvevent

// archPairs and archQuads are empty: the fills are the portable ones
// here.
func archPairs() map[string]func(ws, ws2, p []byte, n int) { return nil }

func archQuads() map[string]func(w2, w4 []byte, n int) { return nil }

// vectorIDs: decodeIDs reads none here.
func vectorIDs() bool { return false }
