package kvevent

import "encoding/binary"

// fillWindowGo is fillWindow in portable Go: the widths eight bytes at a
// time, the distances one byte at a time. p holds idChunk+16 bytes.
func fillWindowGo(ws, ws2 *[idChunk]byte, p []byte) {
	_ = p[idChunk+15]
	var w [idChunk + 16]byte
	for k := 0; k < len(w); k += 8 {
		binary.LittleEndian.PutUint64(w[k:], idWidths(binary.LittleEndian.Uint64(p[k:])))
	}
	copy(ws[:], w[:])
	for k := range idChunk {
		ws2[k] = w[k] + w[k+int(w[k])]
	}
}
