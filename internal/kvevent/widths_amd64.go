//go:build !purego

package kvevent

import "golang.org/x/sys/cpu"

// fillWindow writes into ws the widths of the first n bytes of p, as
// idWidths, each with its notIDFlags flag, and into ws2 the distance from each byte to the id after
// next: its width plus the width of the byte that many bytes on. Sixteen
// bytes at a time where the processor has SSSE3 (every x86-64 processor
// of the last fifteen years), else as fillWindowGo. n is a multiple of
// 16 from 16 to idChunk; p holds n+16 bytes.
func fillWindow(ws, ws2 *[idChunk]byte, p []byte, n int) {
	switch {
	case cpu.X86.HasAVX2:
		fillWindowWide(ws, ws2, p, n)
	case cpu.X86.HasSSSE3:
		fillWindowNarrow(ws, ws2, p, n)
	default:
		fillWindowGo(ws, ws2, p, n)
	}
}

// fillWindowNarrow is fillWindow sixteen bytes at a time (SSSE3).
func fillWindowNarrow(ws, ws2 *[idChunk]byte, p []byte, n int) {
	_ = p[n+15]
	fillWindowSSSE3(&ws[0], &ws2[0], &p[0], n)
}

// fillWindowWide is fillWindow thirty-two bytes at a time (AVX2) as far
// as thirty-two bytes follow, then sixteen at a time.
func fillWindowWide(ws, ws2 *[idChunk]byte, p []byte, n int) {
	_ = p[n+15]
	k := (n - 16) &^ 31
	if k > 0 {
		fillWindowAVX2(&ws[0], &ws2[0], &p[0], k)
	}
	fillWindowSSSE3(&ws[k], &ws2[k], &p[k], n-k)
}

//go:noescape
func fillWindowAVX2(ws, ws2 *byte, p *byte, n int)

//go:noescape
func fillWindowSSSE3(ws, ws2 *byte, p *byte, n int)
