package blockhash

import (
	"encoding/binary"
	"math/bits"

	"github.com/zeebo/xxh3"
)

// XXH3's constants, from its specification.
const (
	prime32_1 = 0x9E3779B1
	prime32_2 = 0x85EBCA77
	prime32_3 = 0xC2B2AE3D
	prime64_1 = 0x9E3779B185EBCA87
	prime64_2 = 0xC2B2AE3D27D4EB4F
	prime64_3 = 0x165667B19E3779F9
	prime64_4 = 0x85EBCA77C2B2AE63
	prime64_5 = 0x27D4EB2F165667C5

	secretSize = 192
	stripeLen  = 64
	// stripesPerBlock stripes are accumulated between two scrambles.
	stripesPerBlock = (secretSize - stripeLen) / 8
	blockLen        = stripeLen * stripesPerBlock
	// midSizeMax is the longest input hashed without the secret.
	midSizeMax = 240
	// maxHead is the longest head sum takes: it must fit in the first
	// stripe, the only one read from a copy.
	maxHead = stripeLen - 1
)

// defaultSecret is XXH3's default secret as little-endian words; a seed's
// secret adds the seed to the even words and subtracts it from the odd.
var defaultSecret = [secretSize / 8]uint64{
	0xbe4ba423396cfeb8, 0x1cad21f72c81017c, 0xdb979083e96dd4de, 0x1f67b3b7a4a44072,
	0x78e5c0cc4ee679cb, 0x2172ffcc7dd05a82, 0x8e2443f7744608b8, 0x4c263a81e69035e0,
	0xcb00c391bb52283c, 0xa32e531b8b65d088, 0x4ef90da297486471, 0xd8acdea946ef1938,
	0x3f349ce33f76faa8, 0x1d4f0bc7c7bbdcf9, 0x3159b4cd4be0518a, 0x647378d9c97e9fc8,
	0xc3ebd33483acc5ea, 0xeb6313faffa081c5, 0x49daf0b751dd0d17, 0x9e68d429265516d3,
	0xfca1477d58be162b, 0xce31d07ad1b8f88f, 0x280416958f3acb45, 0x7e404bbbcafbd7af,
}

// Hasher hashes with one seed, whose secret it derived when made. It is
// read-only after New, so one Hasher serves any number of goroutines; it
// is a value, so that a caller can keep one on its stack.
type Hasher struct {
	seed   uint64
	secret [secretSize]byte
	// fold holds the secret's words that merge XORs into the
	// accumulators, the low half's then the high half's, each at an
	// offset no word load can take without a bounds check.
	fold [16]uint64
}

// New returns a Hasher for seed.
func New(seed uint64) Hasher {
	h := Hasher{seed: seed}
	for i, w := range defaultSecret {
		if i%2 == 0 {
			w += seed
		} else {
			w -= seed
		}
		binary.LittleEndian.PutUint64(h.secret[8*i:], w)
	}
	for i := range 8 {
		h.fold[i] = h.word(11 + 8*i)
		h.fold[8+i] = h.word(secretSize - stripeLen - 11 + 8*i)
	}
	return h
}

// Seed returns the seed h hashes with.
func (h *Hasher) Seed() uint64 { return h.seed }

// Sum returns XXH3_128bits_withSeed(body, seed) as its high and low
// halves. An input of 240 bytes or less is hashed from a copy: in scratch
// when it has room (a caller hashing many such inputs keeps one, saving
// the clearing of a fresh one), else on the stack.
func (h *Hasher) Sum(scratch, body []byte) (hi, lo uint64) {
	return h.sum(scratch, nil, body)
}

// SumAfter is Sum of parent || body, parent being the 16 bytes of phi
// then plo, each big-endian: a content key chained to its child's ids.
// The parent goes from registers into the hash, not through memory
// written just before, which would stall the reads that follow.
func (h *Hasher) SumAfter(scratch []byte, phi, plo uint64, body []byte) (hi, lo uint64) {
	l := keyLen + len(body)
	if l <= 128 && len(body) >= 32 {
		return h.midAfter(bits.ReverseBytes64(phi), bits.ReverseBytes64(plo), body)
	}
	if l <= midSizeMax {
		if len(scratch) < l {
			var in [midSizeMax]byte
			scratch = in[:]
		}
		in := scratch[:l]
		binary.BigEndian.PutUint64(in, phi)
		binary.BigEndian.PutUint64(in[8:], plo)
		copy(in[keyLen:], body)
		u := xxh3.Hash128Seed(in, h.seed)
		return u.Hi, u.Lo
	}
	if hi, lo, ok := h.longAfter(true, bits.ReverseBytes64(phi), bits.ReverseBytes64(plo), body); ok {
		return hi, lo
	}
	var head [keyLen]byte
	binary.BigEndian.PutUint64(head[:8], phi)
	binary.BigEndian.PutUint64(head[8:], plo)
	return h.sum(scratch, head[:], body)
}

// midAfter is XXH3's path for 17 to 128 bytes over the 16 bytes whose
// little-endian words are h0 and h1, then body (32 bytes or more, so
// that no word read from the end starts in the head): pairs of words from
// the start and from the end, the outermost first, read in place.
func (h *Hasher) midAfter(h0, h1 uint64, body []byte) (hi, lo uint64) {
	n := len(body)
	l := uint64(keyLen + n)
	lo = l * prime64_1
	end := body[n-32:]
	mix := func(i int, a0, a1, b0, b1 uint64) {
		hi += mulFold(b0^h.word(32*i+16), b1^h.word(32*i+24))
		hi ^= a0 + a1
		lo += mulFold(a0^h.word(32*i), a1^h.word(32*i+8))
		lo ^= b0 + b1
	}
	if n > 80 {
		mix(3, le(body[32:]), le(body[40:]), le(body[n-64:]), le(body[n-56:]))
	}
	if n > 48 {
		mix(2, le(body[16:]), le(body[24:]), le(body[n-48:]), le(body[n-40:]))
	}
	mix(1, le(body[0:]), le(body[8:]), le(end[0:]), le(end[8:]))
	mix(0, h0, h1, le(end[16:]), le(end[24:]))
	hi, lo = lo*prime64_1+hi*prime64_4+(l-h.seed)*prime64_2, hi+lo
	return -avalanche(hi), avalanche(lo)
}

func le(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }

// keyLen is the length of the parent SumAfter chains to.
const keyLen = 16

// sum is XXH3_128bits_withSeed(head || body, seed); head must be at most
// maxHead bytes.
func (h *Hasher) sum(scratch, head, body []byte) (hi, lo uint64) {
	if len(head) > maxHead {
		panic("blockhash: head longer than maxHead")
	}
	l := len(head) + len(body)
	if l > midSizeMax {
		return h.long(head, body, l)
	}
	if len(scratch) < l {
		var in [midSizeMax]byte
		scratch = in[:]
	}
	in := scratch[:l]
	copy(in[copy(in, head):], body)
	u := xxh3.Hash128Seed(in, h.seed)
	return u.Hi, u.Lo
}

// long is XXH3's long-input path over head || body.
func (h *Hasher) long(head, body []byte, l int) (hi, lo uint64) {
	if len(head) == 0 {
		if hi, lo, ok := h.longAfter(false, 0, 0, body); ok {
			return hi, lo
		}
	}
	var acc [8]uint64
	h.stripes(&acc, head, body, l)
	return h.merge(&acc, l)
}

// stripes accumulates every stripe of head || body into acc, from XXH3's
// starting values. Stripe s of the input starts at byte 64s; every stripe
// but the first lies wholly in body (head is shorter than a stripe, body
// longer than three), so only the first is read from a copy.
func (h *Hasher) stripes(acc *[8]uint64, head, body []byte, l int) {
	*acc = [8]uint64{prime32_3, prime64_1, prime64_2, prime64_3, prime64_4, prime32_2, prime64_5, prime32_1}
	var first [stripeLen]byte
	n := copy(first[:], head)
	copy(first[n:], body)
	// stripes accumulates n stripes from stripe g on, with the secret
	// from byte 8 of it for each.
	stripes := func(g, n int) {
		sec := 0
		if g == 0 {
			accumulate(acc, first[:], h.secret[:], 1)
			g, n, sec = 1, n-1, 8
		}
		if n > 0 {
			accumulate(acc, body[g*stripeLen-len(head):], h.secret[sec:], n)
		}
	}
	blocks := (l - 1) / blockLen
	for b := range blocks {
		stripes(b*stripesPerBlock, stripesPerBlock)
		scramble(acc, h.secret[secretSize-stripeLen:])
	}
	if last := (l - 1 - blocks*blockLen) / stripeLen; last > 0 {
		stripes(blocks*stripesPerBlock, last)
	}
	accumulate(acc, body[l-stripeLen-len(head):], h.secret[secretSize-stripeLen-7:], 1)
}

// merge folds the accumulators of an input of l bytes into its hash.
func (h *Hasher) merge(acc *[8]uint64, l int) (hi, lo uint64) {
	f := &h.fold
	a0, a1, a2, a3, a4, a5, a6, a7 := acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]
	lo = uint64(l)*prime64_1 + mulFold(a0^f[0], a1^f[1]) + mulFold(a2^f[2], a3^f[3]) +
		mulFold(a4^f[4], a5^f[5]) + mulFold(a6^f[6], a7^f[7])
	hi = ^(uint64(l) * prime64_2) + mulFold(a0^f[8], a1^f[9]) + mulFold(a2^f[10], a3^f[11]) +
		mulFold(a4^f[12], a5^f[13]) + mulFold(a6^f[14], a7^f[15])
	return avalanche(hi), avalanche(lo)
}

func (h *Hasher) word(off int) uint64 { return binary.LittleEndian.Uint64(h.secret[off:]) }

func mulFold(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

func avalanche(x uint64) uint64 {
	x ^= x >> 37
	x *= 0x165667919E3779F9
	return x ^ x>>32
}

// scramble mixes the accumulators at the end of a block of stripes.
func scramble(acc *[8]uint64, secret []byte) {
	for i := range acc {
		a := acc[i]
		a ^= a >> 47
		a ^= binary.LittleEndian.Uint64(secret[8*i:])
		acc[i] = a * prime32_1
	}
}

// accumulateGeneric adds n stripes of p to acc, stripe s with the
// secret from byte 8s on.
func accumulateGeneric(acc *[8]uint64, p, secret []byte, n int) {
	for s := range n {
		in, sec := p[s*stripeLen:s*stripeLen+stripeLen], secret[8*s:8*s+stripeLen]
		for i := range 8 {
			v := binary.LittleEndian.Uint64(in[8*i:])
			k := v ^ binary.LittleEndian.Uint64(sec[8*i:])
			acc[i^1] += v
			acc[i] += uint64(uint32(k)) * (k >> 32)
		}
	}
}
