//go:build !purego

package server

// classifyIDs fills m with the classes of the 64 bytes of p, sixteen
// bytes at a time with SSE2, which every x86-64 processor has.
func classifyIDs(m *idClasses, p []byte) {
	_ = p[63]
	classifyIDsSSE2(m, &p[0])
}

//go:noescape
func classifyIDsSSE2(m *idClasses, p *byte)
