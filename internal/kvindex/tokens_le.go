//go:build 386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm

package kvindex

import "unsafe"

// tokenBytes returns the tokens' memory as is: on little-endian machines
// it already is the wire encoding, so a key hashes the ids where they lie,
// without a copy. dst is not used.
func tokenBytes(_ []byte, tokens []uint32) []byte {
	if len(tokens) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(tokens))), 4*len(tokens))
}
