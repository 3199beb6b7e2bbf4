//go:build !amd64 || purego

package kvevent

// fillWindow writes into ws the widths of the first n bytes of p, as
// idWidths, each with its notIDFlags flag, and into ws2 the distance from each byte to the id after
// next: its width plus the width of the byte that many bytes on. n is a
// multiple of 16 from 16 to idChunk; p holds n+16 bytes.
func fillWindow(ws, ws2 *[idChunk]byte, p []byte, n int) {
	fillWindowGo(ws, ws2, p, n)
}
