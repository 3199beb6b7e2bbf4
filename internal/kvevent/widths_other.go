//go:build !amd64 || purego

package kvevent

import "encoding/binary"

// fillWindow writes into ws the widths of the first idChunk bytes of p,
// eight at a time.
func fillWindow(ws *[idChunk]byte, p []byte) {
	_ = p[idChunk-1]
	for k := 0; k < idChunk; k += 8 {
		binary.LittleEndian.PutUint64(ws[k:], idWidths(binary.LittleEndian.Uint64(p[k:])))
	}
}
