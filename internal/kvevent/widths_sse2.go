//go:build amd64 && !purego

package kvevent

// fillWindow writes into ws the widths of the first idChunk bytes of p,
// sixteen at a time (SSE2, which every amd64 processor has).
func fillWindow(ws *[idChunk]byte, p []byte) {
	_ = p[idChunk-1]
	fillWindowSSE2(&ws[0], &p[0], idChunk)
}

//go:noescape
func fillWindowSSE2(ws *byte, p *byte, n int)
