//go:build !purego

package kvevent

import "golang.org/x/sys/cpu"

// archPairs and archQuads are the fills of this architecture that
// fillPairs and fillQuads choose between, each checked whatever the
// processor the tests run on makes them pick.
func archPairs() map[string]func(ws, ws2, p []byte, n int) {
	fills := map[string]func(ws, ws2, p []byte, n int){}
	if cpu.X86.HasSSSE3 {
		fills["fillPairsNarrow"] = fillPairsNarrow
	}
	if cpu.X86.HasAVX2 {
		fills["fillPairsWide"] = fillPairsWide
	}
	return fills
}

func archQuads() map[string]func(w2, w4 []byte, n int) {
	fills := map[string]func(w2, w4 []byte, n int){}
	if cpu.X86.HasSSSE3 {
		fills["fillQuadsNarrow"] = fillQuadsNarrow
	}
	if cpu.X86.HasAVX2 {
		fills["fillQuadsWide"] = fillQuadsWide
	}
	return fills
}

// vectorIDs is whether decodeIDs reads ids on this processor.
func vectorIDs() bool { return idsAVX512 }
