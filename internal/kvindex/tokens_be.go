//go:build !(386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm)

package kvindex

func putTokens(dst []byte, tokens []uint32) { putTokensPortable(dst, tokens) }
