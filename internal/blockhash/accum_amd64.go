//go:build !purego

package blockhash

import "golang.org/x/sys/cpu"

// What the processor offers, read once and never changed.
var (
	accAVX512 = cpu.X86.HasAVX512F
	accAVX2   = cpu.X86.HasAVX2
)

// accumulate adds n stripes of p to acc, stripe s with the secret from
// byte 8s on (accumulateGeneric, a stripe to two vector ops). Where
// AVX-512 is present stripesAfter takes every input a caller hashes.
func accumulate(acc *[8]uint64, p, secret []byte, n int) {
	if n <= 0 {
		return
	}
	_, _ = p[n*stripeLen-1], secret[8*(n-1)+stripeLen-1]
	if accAVX2 {
		accumAVX2(acc, &p[0], &secret[0], n)
	} else {
		accumulateGeneric(acc, p, secret, n)
	}
}

// stripesAfter accumulates into acc, from XXH3's starting values, all the
// stripes of an input longer than midSizeMax: when headed, the 16 bytes
// whose little-endian words are h0 and h1, then body; else body alone. It
// reports false, leaving acc alone, where the processor lacks AVX-512.
func stripesAfter(acc *[8]uint64, headed bool, h0, h1 uint64, body []byte, secret *[secretSize]byte) bool {
	if !accAVX512 {
		return false
	}
	flag, l := 0, len(body)
	if headed {
		flag, l = 1, l+keyLen
	}
	if l <= midSizeMax {
		return false
	}
	stripesAVX512(acc, flag, h0, h1, &body[0], &secret[0], (l-1)/stripeLen, &body[len(body)-stripeLen])
	return true
}

//go:noescape
func stripesAVX512(acc *[8]uint64, headed int, h0, h1 uint64, body, secret *byte, n int, last *byte)

//go:noescape
func accumAVX2(acc *[8]uint64, p, secret *byte, n int)
