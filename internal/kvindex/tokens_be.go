//go:build !(386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm)

package kvindex

// tokenBytes encodes tokens into dst, which must hold 4 bytes a token,
// and returns the encoded part.
func tokenBytes(dst []byte, tokens []uint32) []byte {
	putTokensPortable(dst, tokens)
	return dst[:4*len(tokens)]
}
