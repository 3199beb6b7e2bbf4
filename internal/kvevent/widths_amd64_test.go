//go:build !purego

package kvevent

import "golang.org/x/sys/cpu"

// archFills are the fills of this architecture that fillWindow chooses
// between, each checked whatever the processor fillWindow runs on picks.
func archFills() map[string]func(ws, ws2 *[idChunk]byte, p []byte, n int) {
	fills := map[string]func(ws, ws2 *[idChunk]byte, p []byte, n int){}
	if cpu.X86.HasSSSE3 {
		fills["fillWindowNarrow"] = fillWindowNarrow
	}
	if cpu.X86.HasAVX2 {
		fills["fillWindowWide"] = fillWindowWide
	}
	return fills
}
