//go:build !purego

package server

// classifyIDs fills m with the classes of the 64 bytes of p, at once
// where the processor has what takeIDs needs of AVX-512, else sixteen
// bytes at a time with SSE2, which every x86-64 processor has.
func classifyIDs(m *idClasses, p []byte) {
	_ = p[63]
	classifyIDsAsm(m, &p[0])
}

// classifyIDsAsm jumps to classifyIDsAVX512 or classifyIDsSSE2.
//
//go:noescape
func classifyIDsAsm(m *idClasses, p *byte)

//go:noescape
func classifyIDsAVX512(m *idClasses, p *byte)

//go:noescape
func classifyIDsSSE2(m *idClasses, p *byte)
