//go:build 386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm

package kvindex

import "unsafe"

// putTokens copies the tokens' memory as is: on little-endian machines it
// already is the wire encoding, and a block copy is several times faster
// than encoding token by token, which dominated the cost of a key.
func putTokens(dst []byte, tokens []uint32) {
	if len(tokens) == 0 {
		return
	}
	src := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(tokens))), 4*len(tokens))
	copy(dst[:len(src)], src)
}
