//go:build amd64 && !purego

package kvevent

// fillWindow writes into ws the widths of the first idChunk bytes of p,
// as idWidths, and into ws2 the distance from each byte to the id after
// next (nextWidths), sixteen bytes at a time (SSE2, which every amd64
// processor has). p holds idChunk+16 bytes.
func fillWindow(ws, ws2 *[idChunk]byte, p []byte) {
	_ = p[idChunk+15]
	fillWindow2SSE2(&ws[0], &ws2[0], &p[0], idChunk)
}

//go:noescape
func fillWindow2SSE2(ws, ws2 *byte, p *byte, n int)
