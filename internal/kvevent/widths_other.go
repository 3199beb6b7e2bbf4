//go:build !amd64 || purego

package kvevent

// fillWindow writes into ws the widths of the first idChunk bytes of p,
// as idWidths, and into ws2 the distance from each byte to the id after
// next: its width plus the width of the byte that many bytes on. p holds
// idChunk+16 bytes.
func fillWindow(ws, ws2 *[idChunk]byte, p []byte) {
	fillWindowGo(ws, ws2, p)
}
