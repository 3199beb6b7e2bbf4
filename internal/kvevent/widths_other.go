//go:build !amd64 || purego

package kvevent

// fillPairs writes into ws the widths of the first n bytes of p, as
// idWidths, each with its notIDFlags flag, and into ws2 the distance
// from each byte to the id after next: its width plus the width of the
// byte that many bytes on. n is a multiple of 16 from 16 to idChunk+16;
// p holds n+16 bytes.
func fillPairs(ws, ws2, p []byte, n int) { fillPairsGo(ws, ws2, p, n) }

// fillQuads writes into w4 the distance from each of the first n bytes
// to the fourth id on: its w2 plus the w2 of the byte that many bytes
// on. n is a multiple of 16; w2 holds n+16 bytes.
func fillQuads(w2, w4 []byte, n int) { fillQuadsGo(w2, w4, n) }

// walkQuads walks the ids of dst four at a time in the window whose
// widths win holds, from position j on, while j is below walkStride,
// four ids are left and none of the next four bytes it takes for type
// bytes is flagged; q[k : k+8] are the eight bytes that end where the
// byte of position k starts. It returns how many ids it read and the
// position after them.
func walkQuads(win *window, q *[idChunk + 8]byte, dst []uint32, j uint) (int, uint) {
	return walkQuadsGo(win, q, dst, j)
}
