package blockhash

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/zeebo/xxh3"
)

func reference(seed uint64, head, body []byte) xxh3.Uint128 {
	return xxh3.Hash128Seed(append(append([]byte{}, head...), body...), seed)
}

func randomBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// R-IDX-1: a block's content key is XXH3-128 of parent || tokens with the
// stream's seed. Sum gives zeebo/xxh3's (and so the reference's) answer
// for every length up to past two of XXH3's blocks, every head length a
// key can have and more, and seeds that flip the secret's words' carries.
func TestSumMatchesXXH3RIDX1(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	// Scratch of room for any short input, too little, and none.
	scratches := [][]byte{make([]byte, midSizeMax), make([]byte, 50), nil}
	for _, seed := range []uint64{0, 1, 1024, 1 << 63, ^uint64(0), r.Uint64(), r.Uint64()} {
		h := New(seed)
		if h.Seed() != seed {
			t.Fatalf("seed %d reads %d", seed, h.Seed())
		}
		for _, hl := range []int{0, 1, 16, maxHead} {
			head := randomBytes(r, hl)
			for l := hl; l <= 2*blockLen+3*stripeLen+1; l++ {
				body := randomBytes(r, l-hl)
				hi, lo := h.sum(scratches[l%3], head, body)
				if want := reference(seed, head, body); hi != want.Hi || lo != want.Lo {
					t.Fatalf("seed %#x head %d body %d: %016x%016x, want %016x%016x", seed, hl, l-hl, hi, lo, want.Hi, want.Lo)
				}
			}
		}
	}
}

// Sum and SumAfter, whose inputs take the copy, the in-place middle path
// or the long path by length, agree with zeebo/xxh3 at every length to
// past one XXH3 block, with parents of zero bytes too.
func TestSumAfterMatchesXXH3(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, seed := range []uint64{0, 1024, r.Uint64()} {
		h := New(seed)
		scratch := make([]byte, midSizeMax)
		for n := 0; n <= blockLen+2*stripeLen; n++ {
			body := randomBytes(r, n)
			hi, lo := h.Sum(scratch, body)
			if want := reference(seed, nil, body); hi != want.Hi || lo != want.Lo {
				t.Fatalf("seed %#x, %d bytes: %016x%016x, want %016x%016x", seed, n, hi, lo, want.Hi, want.Lo)
			}
			for _, p := range [][2]uint64{{r.Uint64(), r.Uint64()}, {0, 0}} {
				var parent [keyLen]byte
				binary.BigEndian.PutUint64(parent[:8], p[0])
				binary.BigEndian.PutUint64(parent[8:], p[1])
				hi, lo := h.SumAfter(scratch[:n%midSizeMax], p[0], p[1], body)
				if want := reference(seed, parent[:], body); hi != want.Hi || lo != want.Lo {
					t.Fatalf("seed %#x, %d bytes after %x: %016x%016x, want %016x%016x", seed, n, parent, hi, lo, want.Hi, want.Lo)
				}
			}
		}
	}
}

// Token ids of real widths, as kvindex hashes them: 16-byte parents and
// blocks of 16 to 512 ids.
func TestSumOfBlocksMatchesXXH3(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	h := New(1024)
	for _, ids := range []int{16, 56, 57, 64, 128, 252, 253, 256, 512} {
		body := make([]byte, 4*ids)
		for i := 0; i < len(body); i += 4 {
			v := r.Uint32N(152064)
			body[i], body[i+1], body[i+2], body[i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		}
		scratch := make([]byte, keyLen+len(body))
		hi, lo := h.Sum(scratch, body)
		if want := reference(1024, nil, body); hi != want.Hi || lo != want.Lo {
			t.Fatalf("%d ids: %016x%016x, want %016x%016x", ids, hi, lo, want.Hi, want.Lo)
		}
		// A parent of zero bytes is a parent, not none.
		for _, p := range [][2]uint64{{r.Uint64(), r.Uint64()}, {0, 0}, {0, 1}} {
			var parent [keyLen]byte
			binary.BigEndian.PutUint64(parent[:8], p[0])
			binary.BigEndian.PutUint64(parent[8:], p[1])
			hi, lo := h.SumAfter(scratch, p[0], p[1], body)
			if want := reference(1024, parent[:], body); hi != want.Hi || lo != want.Lo {
				t.Fatalf("%d ids after %x: %016x%016x, want %016x%016x", ids, parent, hi, lo, want.Hi, want.Lo)
			}
		}
	}
}

func TestSumRefusesLongHead(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("a head of a full stripe was taken")
		}
	}()
	h := New(0)
	h.sum(nil, make([]byte, maxHead+1), make([]byte, 300))
}

// Every accumulate this processor can run gives the generic one's sums.
func TestAccumulatePathsAgree(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	h := New(r.Uint64())
	p := randomBytes(r, stripesPerBlock*stripeLen)
	for n := 1; n <= stripesPerBlock; n++ {
		var want, got [8]uint64
		for i := range want {
			want[i] = r.Uint64()
		}
		got = want
		accumulateGeneric(&want, p, h.secret[:], n)
		accumulate(&got, p, h.secret[:], n)
		if got != want {
			t.Fatalf("%d stripes: %x, want %x", n, got, want)
		}
		for name, f := range accumulators() {
			got = want
			acc := want
			accumulateGeneric(&acc, p, h.secret[:], n)
			f(&got, p, h.secret[:], n)
			if got != acc {
				t.Fatalf("%s, %d stripes: %x, want %x", name, n, got, acc)
			}
		}
	}
}

// The vector path over a whole input, stripes and merge, gives what the
// general one does wherever it runs: one block or less, and several with
// scrambles between.
func TestLongPathAgrees(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	h := New(r.Uint64())
	for _, headed := range []bool{false, true} {
		head := randomBytes(r, keyLen)
		h0, h1 := binary.LittleEndian.Uint64(head), binary.LittleEndian.Uint64(head[8:])
		if !headed {
			head = nil
		}
		for l := midSizeMax + 1; l <= 3*blockLen+2*stripeLen; l++ {
			body := randomBytes(r, l-len(head))
			var acc [8]uint64
			h.stripes(&acc, head, body, l)
			whi, wlo := h.merge(&acc, l)
			if hi, lo, ok := h.longAfter(headed, h0, h1, body); ok && (hi != whi || lo != wlo) {
				t.Fatalf("head %d, %d bytes: %016x%016x, want %016x%016x", len(head), l, hi, lo, whi, wlo)
			}
		}
	}
	if _, _, ok := h.longAfter(false, 0, 0, make([]byte, midSizeMax)); ok {
		t.Fatal("the vector path took a short input")
	}
	if _, _, ok := h.longAfter(true, 0, 0, make([]byte, midSizeMax-keyLen)); ok {
		t.Fatal("the vector path took a short input after a head")
	}
}

func FuzzSum(f *testing.F) {
	f.Add(uint64(1024), []byte("0123456789abcdef"), bytes.Repeat([]byte{7}, 512))
	f.Add(uint64(0), []byte{}, bytes.Repeat([]byte{1}, 1500))
	f.Fuzz(func(t *testing.T, seed uint64, head, body []byte) {
		if len(head) > maxHead {
			head = head[:maxHead]
		}
		h := New(seed)
		hi, lo := h.sum(nil, head, body)
		if want := reference(seed, head, body); hi != want.Hi || lo != want.Lo {
			t.Fatalf("seed %#x head %d body %d: %016x%016x, want %016x%016x", seed, len(head), len(body), hi, lo, want.Hi, want.Lo)
		}
	})
}

// BenchmarkSum hashes a block of ids after a 16-byte parent, the
// parent being the hash before (a prompt's chain of keys), against
// zeebo/xxh3 over the same bytes in one piece (the copy included, as a
// caller must make it).
func BenchmarkSum(b *testing.B) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, ids := range []int{16, 64, 128, 256} {
		body := randomBytes(r, 4*ids)
		b.Run(fmt.Sprintf("ids=%d/blockhash", ids), func(b *testing.B) {
			h := New(1024)
			scratch := make([]byte, midSizeMax)
			b.ReportAllocs()
			var hi, lo uint64
			for range b.N {
				hi, lo = h.SumAfter(scratch, hi, lo, body)
			}
			sink = hi ^ lo
		})
		b.Run(fmt.Sprintf("ids=%d/xxh3", ids), func(b *testing.B) {
			buf := make([]byte, keyLen+4*ids)
			b.ReportAllocs()
			var u xxh3.Uint128
			for range b.N {
				binary.BigEndian.PutUint64(buf, u.Hi)
				binary.BigEndian.PutUint64(buf[8:], u.Lo)
				copy(buf[keyLen:], body)
				u = xxh3.Hash128Seed(buf, 1024)
			}
			sink = u.Hi ^ u.Lo
		})
	}
}

var sink uint64
