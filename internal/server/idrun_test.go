package server

import (
	"bytes"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// idArrayBody builds {"token_ids":[...]} of n elements: mostly plain ids
// of random width (one to ten digits), and with probability odd per
// element one of the forms the block parser must leave to the element
// by element path: whitespace, leading zeros, signs, fractions,
// exponents, ids past uint32, other JSON values (not null, which
// encoding/json takes as 0), a trailing comma, and separators other than
// ',' and ", ": a space alone, two commas, whitespace around them. With
// probability spaced an element follows ", " (Python's json.dumps
// separator) instead of ",".
func idArrayBody(rng *rand.Rand, n int, odd, spaced float64) []byte {
	oddForms := []string{"0", "00", "01", "-0", "-1", "1.5", "1e3", "4294967295", "4294967296",
		"99999999999", " 7", "8 ", "\n9", "true", `"9"`, "[1]", "12345678", "123456789", "1234567890"}
	oddSeps := []string{" ", ",,", " ,", ",  ", ",\n", ", ,", "\t,", "]", "],", "}"}
	b := []byte(`{"token_ids":[`)
	for i := range n {
		if i > 0 {
			switch {
			case rng.Float64() < odd:
				b = append(b, oddSeps[rng.IntN(len(oddSeps))]...)
			case rng.Float64() < spaced:
				b = append(b, ", "...)
			default:
				b = append(b, ',')
			}
		}
		if rng.Float64() < odd {
			b = append(b, oddForms[rng.IntN(len(oddForms))]...)
			continue
		}
		digits := 1 + rng.IntN(10)
		v := uint64(rng.IntN(9) + 1)
		for range digits - 1 {
			v = v*10 + uint64(rng.IntN(10))
		}
		b = strconv.AppendUint(b, v%(math.MaxUint32+1), 10)
	}
	if n > 0 && rng.IntN(20) == 0 {
		b = append(b, ',')
	}
	return append(b, "]}"...)
}

// TestIDBlocksMatchElementPath checks the block parser of
// id runs (idRun) against the element by element path and encoding/json
// (R-API-5), with "," and ", " between elements: the same body read
// through buffers from 16 bytes (where no
// block fits) to the whole body gives the same ids, or the same error
// message, offsets included, and accepts exactly the bodies of in-range
// integer ids that encoding/json accepts. maxIDs is set near the length
// so that the limit also falls inside runs taken by blocks.
func TestIDBlocksMatchElementPath(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 7))
	for round := range 3000 {
		odd := []float64{0, 0.002, 0.02, 0.2}[round%4]
		spaced := []float64{0, 1, 0.5}[round%3]
		body := idArrayBody(rng, rng.IntN(400), odd, spaced)
		if round%2 == 1 {
			// Whitespace after the object, which both parsers allow,
			// puts the array's ']' inside a block the block parser takes.
			body = append(body, bytes.Repeat([]byte(" "), idBlockNeeds+rng.IntN(64))...)
		}
		ref, valid, refErr := jsonTokenIDs(body)
		maxIDs := math.MaxInt32
		if round%5 == 0 && len(ref) > 0 {
			maxIDs = rng.IntN(len(ref)) + 1
		}
		var first []uint32
		var firstErr string
		for i, size := range []int{16, idBlockNeeds, idBlockNeeds + 1, 100, 257, 4096, len(body) + 1} {
			sc := scanner{r: bytes.NewReader(body), buf: make([]byte, size), limit: math.MaxInt64}
			ids, perr := parseQuery(&sc, nil, maxIDs)
			msg := ""
			if perr != nil {
				ids, msg = nil, perr.message
				if perr.status != 400 {
					t.Fatalf("%q: status %d %q", body, perr.status, msg)
				}
			}
			if i == 0 {
				first, firstErr = ids, msg
				switch {
				case perr == nil && !valid:
					t.Fatalf("accepted %q, encoding/json: %v %v", body, refErr, ref)
				case perr == nil && (len(ids) != len(ref) || len(ids) > maxIDs):
					t.Fatalf("%q: %d ids, encoding/json %d (max %d)", body, len(ids), len(ref), maxIDs)
				case perr != nil && valid && len(ref) <= maxIDs:
					t.Fatalf("rejected %q (%s), encoding/json accepts it", body, msg)
				}
				for j := range ids {
					if int64(ids[j]) != ref[j] {
						t.Fatalf("%q: id %d is %d, encoding/json %d", body, j, ids[j], ref[j])
					}
				}
				continue
			}
			if msg != firstErr || !slices.Equal(ids, first) {
				t.Fatalf("%q through a %d-byte buffer: %d ids, error %q; through 16 bytes: %d ids, error %q",
					body, size, len(ids), msg, len(first), firstErr)
			}
		}
	}
}

// TestNonDigitsAndEightDigits checks the two word operations on every
// byte value in every position, and every digit count.
func TestNonDigitsAndEightDigits(t *testing.T) {
	for pos := range 8 {
		for c := range 256 {
			w := []byte("55555555")
			w[pos] = byte(c)
			a := leUint64(w) ^ 0x3030303030303030
			m := nonDigits(a)
			want := uint64(0)
			if c < '0' || c > '9' {
				want = 0x80 << (8 * pos)
			}
			if m != want {
				t.Fatalf("byte %#x at %d: mask %#x, want %#x", c, pos, m, want)
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for n := 1; n <= 8; n++ {
		for range 1000 {
			v := rng.Uint64N(uint64(math.Pow10(n)))
			s := []byte(strconv.FormatUint(v, 10))
			for len(s) < n {
				s = append([]byte{'0'}, s...)
			}
			s = append(s, ",xxxxxxx"[:8-n]...)
			a := leUint64(s) ^ 0x3030303030303030
			if got := eightDigits(a << (64 - 8*n)); got != v {
				t.Fatalf("%q (%d digits): %d, want %d", s, n, got, v)
			}
		}
	}
}

func leUint64(b []byte) uint64 {
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}

// TestIDBlockSpaceAtBlockEnd puts the space of a ", " separator on the
// first byte past a 64-byte block (R-API-5): the first block starts after
// `{"token_ids":[`, at byte 14, and a 7-digit id then 6-digit ones, each
// separated by ", ", put a comma on the block's last byte, 77.
func TestIDBlockSpaceAtBlockEnd(t *testing.T) {
	body := []byte(`{"token_ids":[1234567`)
	want := []uint32{1234567}
	for i := range 40 {
		id := uint32(100000 + 7*i) // six digits: each element is eight bytes
		body = strconv.AppendUint(append(body, ", "...), uint64(id), 10)
		want = append(want, id)
	}
	body = append(body, "]}"...)
	if body[77] != ',' || body[78] != ' ' {
		t.Fatalf("the comma is not on byte 77: %q", body[70:86])
	}
	// The block path itself takes the whole array, not only the element
	// by element one after it.
	buf := append(slices.Clone(body), make([]byte, idBlockNeeds)...)
	run := scanner{buf: buf, pos: len(`{"token_ids":[`), end: len(buf)}
	if ids, closed := run.idRun(nil, math.MaxInt32); !closed || !slices.Equal(ids, want) {
		t.Fatalf("idRun: %v, closed %v; want %v", ids, closed, want)
	}
	for _, size := range []int{idBlockNeeds, 100, len(body) + 1} {
		sc := scanner{r: bytes.NewReader(body), buf: make([]byte, size), limit: math.MaxInt64}
		ids, perr := parseQuery(&sc, nil, math.MaxInt32)
		if perr != nil || !slices.Equal(ids, want) {
			t.Fatalf("through a %d-byte buffer: %v, error %v; want %v", size, ids, perr, want)
		}
	}
}

// TestClassifyIDs checks the classifications of a block, the machine's
// (SSE2 and AVX-512 assembly on amd64) and the portable one, against a
// definition that looks at one byte at a time: every byte value at every
// position, and random blocks mostly of the bytes an id array holds.
func TestClassifyIDs(t *testing.T) {
	want := func(p []byte) idClasses {
		var m idClasses
		for i, c := range p[:64] {
			bit := uint64(1) << i
			if c >= '0' && c <= '9' {
				m.digit |= bit
			}
			switch c {
			case '0':
				m.zero |= bit
			case ',':
				m.comma |= bit
			case ' ':
				m.space |= bit
			case ']':
				m.close |= bit
			}
		}
		return m
	}
	classifiers := map[string]func(*idClasses, []byte){"classifyIDs": classifyIDs, "classifyIDsGo": classifyIDsGo}
	for name, f := range machineClassifiers() {
		classifiers[name] = f
	}
	check := func(p []byte) {
		t.Helper()
		w := want(p)
		for name, classify := range classifiers {
			var m idClasses
			classify(&m, p)
			if m != w {
				t.Fatalf("%s(%q) = %+v, want %+v", name, p, m, w)
			}
		}
	}
	for pos := range 64 {
		for c := range 256 {
			p := bytes.Repeat([]byte("5"), 64)
			p[pos] = byte(c)
			check(p)
		}
	}
	rng := rand.New(rand.NewPCG(9, 10))
	alphabet := []byte("0123456789, ]\n-.e\"[\x00\x80\xff/:")
	for range 20000 {
		p := make([]byte, 64)
		for i := range p {
			if rng.IntN(4) == 0 {
				p[i] = byte(rng.Uint32())
			} else {
				p[i] = alphabet[rng.IntN(len(alphabet))]
			}
		}
		check(p)
	}
}

// TestTakeIDs checks takeIDs, which takes a block's ids at once, against
// the ids its masks name read one by one (R-API-5): random blocks of ids
// of one to ten digits (leading zeros among them) after "," or ", ",
// blocks of 32 one-digit ids and of eight-digit ones, and random bytes.
// It takes every id or none: none when one has more than eight digits,
// and it writes nothing past the ids it takes. Skipped where takeIDs
// takes nothing (no AVX-512 VBMI2, other architectures, purego).
func TestTakeIDs(t *testing.T) {
	if !vectorIDs() {
		t.Skip("takeIDs takes nothing in this build or on this processor")
	}
	const sentinel = 0xdeadbeef
	blocks := [][]byte{
		[]byte(strings.Repeat("7,", 32)),
		[]byte(strings.Repeat("12345678,", 7) + "1"),
		[]byte(strings.Repeat("99999999, ", 6) + "1234"),
		[]byte(strings.Repeat("123456789,", 6) + "1234"),
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for range 50000 {
		var b []byte
		switch rng.IntN(8) {
		case 0:
			for range 64 {
				b = append(b, "0123456789, ]x"[rng.IntN(14)])
			}
		default:
			maxDigits := 1 + rng.IntN(10)
			for len(b) < 64 {
				for range 1 + rng.IntN(maxDigits) {
					b = append(b, byte('0'+rng.IntN(10)))
				}
				switch rng.IntN(40) {
				case 0:
					b = append(b, ']')
				case 1:
					b = append(b, ' ')
				case 2, 3, 4, 5, 6, 7, 8, 9, 10:
					b = append(b, ", "...)
				default:
					b = append(b, ',')
				}
			}
		}
		blocks = append(blocks, b)
	}
	took := 0
	for _, b := range blocks {
		blk := make([]byte, idBlockNeeds)
		copy(blk, b)
		var m idClasses
		classifyIDsGo(&m, blk)
		starts, ends, _ := idMasks(&m)
		if ends == 0 {
			continue
		}
		var want []uint32
		long := false
		s := starts
		for e := ends; e != 0; e &= e - 1 {
			from, to := bits.TrailingZeros64(s), bits.TrailingZeros64(e)
			s &= s - 1
			v, err := strconv.ParseUint(string(blk[from:to]), 10, 32)
			if err != nil || to-from > 8 {
				long = true
				break
			}
			want = append(want, uint32(v))
		}
		dst := make([]uint32, 40)
		for i := range dst {
			dst[i] = sentinel
		}
		n := takeIDs(&blk[0], starts, ends, &dst[0])
		switch {
		case long && n >= 0:
			t.Fatalf("%q: took %d ids, one of more than eight digits among them", blk[:64], n)
		case !long && (n != len(want) || !slices.Equal(dst[:n], want)):
			t.Fatalf("%q: took %v (%d), want %v", blk[:64], dst[:max(n, 0)], n, want)
		}
		for i := max(n, 0); i < len(dst); i++ {
			if dst[i] != sentinel {
				t.Fatalf("%q: wrote %d at %d, past the %d ids taken", blk[:64], dst[i], i, n)
			}
		}
		if n > 0 {
			took++
		}
	}
	t.Logf("%d of %d blocks taken at once", took, len(blocks))
}
