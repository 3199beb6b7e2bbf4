package kvevent

import "encoding/binary"

// fillPairsGo is fillPairs in portable Go: the widths eight bytes at a
// time, the distances one byte at a time.
func fillPairsGo(ws, ws2, p []byte, n int) {
	_, _, _ = ws[n-1], ws2[n-1], p[n+15]
	var w [idChunk + 32]byte
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

// fillQuadsGo is fillQuads in portable Go.
func fillQuadsGo(w2, w4 []byte, n int) {
	_, _ = w2[n+15], w4[n-1]
	for k := range n {
		w4[k] = w2[k] + w2[k+int(w2[k])]
	}
}
