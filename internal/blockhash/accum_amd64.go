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
// AVX-512 is present longAfter takes every input a caller hashes.
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

// longAfter is XXH3's long-input path, stripes and merge, over the 16
// bytes whose little-endian words are h0 and h1 when headed, then body.
// ok is false, and nothing hashed, where the processor lacks AVX-512 or
// the input is not longer than midSizeMax.
func (h *Hasher) longAfter(headed bool, h0, h1 uint64, body []byte) (hi, lo uint64, ok bool) {
	if !accAVX512 {
		return 0, 0, false
	}
	flag, l := 0, len(body)
	if headed {
		flag, l = 1, l+keyLen
	}
	if l <= midSizeMax {
		return 0, 0, false
	}
	hi, lo = longAVX512(flag, h0, h1, &body[0], &h.secret[0], (l-1)/stripeLen, &body[len(body)-stripeLen], &h.fold, l)
	return hi, lo, true
}

//go:noescape
func longAVX512(headed int, h0, h1 uint64, body, secret *byte, n int, last *byte, fold *[16]uint64, l int) (hi, lo uint64)

//go:noescape
func accumAVX2(acc *[8]uint64, p, secret *byte, n int)
