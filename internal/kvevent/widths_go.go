package kvevent

import "encoding/binary"

// fillWindowGo is fillWindow in portable Go: the widths eight bytes at a
// time, the distances one byte at a time. n is a multiple of 16 from 16
// to idChunk; p holds n+16 bytes.
func fillWindowGo(ws, ws2 *[idChunk]byte, p []byte, n int) {
	_ = p[n+15]
	var w [idChunk + 16]byte
	for k := 0; k < n+16; k += 8 {
		x := binary.LittleEndian.Uint64(p[k:])
		wx := idWidths(x)
		binary.LittleEndian.PutUint64(w[k:], wx)
		if k < n {
			binary.LittleEndian.PutUint64(ws[k:], wx|notIDFlags(x))
		}
	}
	for k := range n {
		ws2[k] = w[k] + w[k+int(w[k])]
	}
}
