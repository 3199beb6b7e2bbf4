//go:build !amd64 || purego

package kvevent

import "encoding/binary"

// fillWindow writes into ws the widths of the first idChunk bytes of p,
// eight at a time, and into ws2 the distance from each byte to the id
// after next (nextWidths). p holds idChunk+16 bytes.
func fillWindow(ws, ws2 *[idChunk]byte, p []byte) {
	_ = p[idChunk+15]
	var w [idChunk + 16]byte
	for k := 0; k < len(w); k += 8 {
		binary.LittleEndian.PutUint64(w[k:], idWidths(binary.LittleEndian.Uint64(p[k:])))
	}
	copy(ws[:], w[:])
	for k := range idChunk {
		ws2[k] = w[k] + nextWidth(w[k], w[k+1:k+6])
	}
}
