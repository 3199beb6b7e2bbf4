//go:build !purego

package kvevent

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// walkQuadsAMD64 finds a window's w2 and w4 528 and 1056 bytes after its
// w: the build fails if they move.
var (
	_ [unsafe.Offsetof(window{}.w2) - 528]struct{}
	_ [528 - unsafe.Offsetof(window{}.w2)]struct{}
	_ [unsafe.Offsetof(window{}.w4) - 1056]struct{}
	_ [1056 - unsafe.Offsetof(window{}.w4)]struct{}
)

// fillPairs writes into ws the widths of the first n bytes of p, as
// idWidths, each with its notIDFlags flag, and into ws2 the distance
// from each byte to the id after next: its width plus the width of the
// byte that many bytes on. Thirty-two bytes at a time where the
// processor has AVX2, sixteen where it has SSSE3 (every x86-64 processor
// of the last fifteen years), else as fillPairsGo. n is a multiple of 16
// from 16 to idChunk+16; p holds n+16 bytes.
func fillPairs(ws, ws2, p []byte, n int) {
	switch {
	case cpu.X86.HasAVX2:
		fillPairsWide(ws, ws2, p, n)
	case cpu.X86.HasSSSE3:
		fillPairsNarrow(ws, ws2, p, n)
	default:
		fillPairsGo(ws, ws2, p, n)
	}
}

// fillPairsNarrow is fillPairs sixteen bytes at a time (SSSE3).
func fillPairsNarrow(ws, ws2, p []byte, n int) {
	_, _, _ = ws[n-1], ws2[n-1], p[n+15]
	fillPairsSSSE3(&ws[0], &ws2[0], &p[0], n)
}

// fillPairsWide is fillPairs thirty-two bytes at a time (AVX2) as far as
// thirty-two bytes follow, then sixteen at a time.
func fillPairsWide(ws, ws2, p []byte, n int) {
	_, _, _ = ws[n-1], ws2[n-1], p[n+15]
	k := (n - 16) &^ 31
	if k > 0 {
		fillPairsAVX2(&ws[0], &ws2[0], &p[0], k)
	}
	fillPairsSSSE3(&ws[k], &ws2[k], &p[k], n-k)
}

// fillQuads writes into w4 the distance from each of the first n bytes
// to the fourth id on: its w2 plus the w2 of the byte that many bytes
// on. Like fillPairs, thirty-two or sixteen bytes at a time where the
// processor can. n is a multiple of 16; w2 holds n+16 bytes.
func fillQuads(w2, w4 []byte, n int) {
	switch {
	case cpu.X86.HasAVX2:
		fillQuadsWide(w2, w4, n)
	case cpu.X86.HasSSSE3:
		fillQuadsNarrow(w2, w4, n)
	default:
		fillQuadsGo(w2, w4, n)
	}
}

// fillQuadsNarrow is fillQuads sixteen bytes at a time (SSSE3).
func fillQuadsNarrow(w2, w4 []byte, n int) {
	_, _ = w2[n+15], w4[n-1]
	fillQuadsSSSE3(&w2[0], &w4[0], n)
}

// fillQuadsWide is fillQuads thirty-two bytes at a time (AVX2), the last
// sixteen of an odd number of sixteens through fillQuadsSSSE3.
func fillQuadsWide(w2, w4 []byte, n int) {
	_, _ = w2[n+15], w4[n-1]
	k := n &^ 31
	if k > 0 {
		fillQuadsAVX2(&w2[0], &w4[0], k)
	}
	if k < n {
		fillQuadsSSSE3(&w2[k], &w4[k], n-k)
	}
}

// walkQuads walks the ids of dst four at a time in the window whose
// widths win holds, from position j on, while j is below walkStride,
// four ids are left and none of the next four bytes it takes for type
// bytes is flagged; q[k : k+8] are the eight bytes that end where the
// byte of position k starts. It returns how many ids it read and the
// position after them. In assembly: compiled, the step's values do not
// fit the registers, and reloads lengthen each step. A position below
// walkStride reaches at most 24+8 bytes on, inside win and q, so no
// step checks a bound.
func walkQuads(win *window, q *[idChunk + 8]byte, dst []uint32, j uint) (int, uint) {
	if j >= walkStride || len(dst) < 4 {
		return 0, j
	}
	return walkQuadsAMD64(&win.w[0], &q[0], &dst[0], len(dst)/4, j)
}

//go:noescape
func walkQuadsAMD64(w, q *byte, dst *uint32, quads int, j uint) (n int, pos uint)

//go:noescape
func fillPairsAVX2(ws, ws2 *byte, p *byte, n int)

//go:noescape
func fillPairsSSSE3(ws, ws2 *byte, p *byte, n int)

//go:noescape
func fillQuadsAVX2(w2, w4 *byte, n int)

//go:noescape
func fillQuadsSSSE3(w2, w4 *byte, n int)
