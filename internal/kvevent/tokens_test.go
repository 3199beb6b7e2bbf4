package kvevent

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tinylib/msgp/msgp"
)

// refTokens reads a token_ids array the plain way, one element at a time
// with the msgp library: the reference readTokens must agree with.
func refTokens(p []byte) (ids []uint32, ctx bool, rest []byte, ok bool) {
	n, p, err := msgp.ReadArrayHeaderBytes(p)
	if err != nil {
		return nil, false, nil, false
	}
	for range n {
		switch msgp.NextType(p) {
		case msgp.ArrayType:
			if p, err = msgp.Skip(p); err != nil {
				return nil, false, nil, false
			}
			ids, ctx = append(ids, 0), true
		case msgp.UintType:
			var u uint64
			if u, p, err = msgp.ReadUint64Bytes(p); err != nil || u > math.MaxUint32 {
				return nil, false, nil, false
			}
			ids = append(ids, uint32(u))
		case msgp.IntType:
			var v int64
			if v, p, err = msgp.ReadInt64Bytes(p); err != nil || v < 0 || v > math.MaxUint32 {
				return nil, false, nil, false
			}
			ids = append(ids, uint32(v))
		default:
			return nil, false, nil, false
		}
	}
	return ids, ctx, p, true
}

// appendOddToken appends one element that is not one of the four
// encodings readIDs reads, valid or not.
func appendOddToken(p []byte, rng *rand.Rand) []byte {
	switch rng.IntN(9) {
	case 0: // uint64 encoding of a small id
		return append(p, 0xcf, 0, 0, 0, 0, 0, 0, 0, 42)
	case 1: // signed encodings of valid ids
		return append(p, 0xd1, 0x01, 0x02)
	case 2:
		return append(p, 0xd2, 0x00, 0x01, 0x00, 0x00)
	case 3: // a negative id
		return append(p, 0xff)
	case 4: // SGLang's token pair
		return append(p, 0x92, 0x05, 0xcd, 0x01, 0x00)
	case 5: // a float: its type byte 0xcb sits just below the uints
		return append(p, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0)
	case 6: // nil
		return append(p, 0xc0)
	case 7: // an id past 2^32 - 1
		return append(p, 0xcf, 0, 0, 0, 1, 0, 0, 0, 0)
	}
	return append(p, 0xa1, 'x') // a string
}

// TestReadTokensMatchesReference decodes token_ids arrays of every length
// up to a few windows of readIDs and of thousands of ids (many windows),
// with ids of every width mixed and in runs of one width, with and
// without an odd element (other encodings of valid ids, SGLang's pairs,
// and elements that must fail) at a random place, followed by a few or
// many more bytes, alone or after other bytes of a message: readTokens
// must give what reading each element with msgp gives, the same ids, the
// same rest, and an error exactly when that does (R-WIRE-2).
func TestReadTokensMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	stale := new(walkScratch)
	for k := range stale.tail {
		stale.tail[k] = byte(rng.Uint32())
	}
	widths := []uint32{100, 200, 60000, 150000, 0x7f, 0xff, 0xffff, math.MaxUint32}
	for iter := range 20000 {
		n := rng.IntN(700)
		switch iter % 8 {
		case 0, 4:
			n = rng.IntN(20)
		case 1:
			n = 1500 + rng.IntN(6000) // many windows
		}
		p := msgp.AppendArrayHeader(nil, uint32(n))
		odd := -1
		if iter%3 == 0 && n > 0 {
			odd = rng.IntN(n)
		}
		run := rng.IntN(3) == 0
		w := widths[rng.IntN(len(widths))]
		for i := range n {
			if i == odd {
				p = appendOddToken(p, rng)
				continue
			}
			if !run {
				w = widths[rng.IntN(len(widths))]
			}
			p = msgp.AppendUint32(p, uint32(rng.Int64N(int64(w)+1)))
		}
		tail := rng.IntN(3) * 100
		for range tail {
			p = append(p, byte(rng.Uint32()))
		}
		if iter%5 == 2 {
			// A message cut short, most often inside its last ids, which
			// walkTail walks in a copy followed by bytes that are no id.
			p = p[:len(p)-min(len(p), tail+rng.IntN(8))]
		}
		want, wantCtx, wantRest, ok := refTokens(p)
		// Half the arrays lie inside a message, after up to 23 other
		// bytes, as DecodeBatch hands them over: from 8 on, the walk
		// starts at the first id, reading the bytes before it.
		// One walk's memory for every array, full of what the arrays
		// before left there, as a decoder's is.
		b := Batch{walk: stale}
		if iter%2 == 1 {
			msg := make([]byte, rng.IntN(24), len(p)+24)
			for k := range msg {
				msg[k] = byte(rng.Uint32())
			}
			b.payload = append(msg, p...)
			p = b.payload[len(msg):]
		}
		got, ctx, rest, err := readTokens(p, &b)
		if (err == nil) != ok {
			t.Fatalf("iteration %d (%d ids, odd at %d): error %v, reference ok %v\n% x", iter, n, odd, err, ok, p)
		}
		if !ok {
			continue
		}
		if !slices.Equal(got, want) || ctx != wantCtx || len(rest) != len(wantRest) {
			t.Fatalf("iteration %d (%d ids, odd at %d): got %d ids, ctx %v, %d bytes left; want %d, %v, %d\n% x",
				iter, n, odd, len(got), ctx, len(rest), len(want), wantCtx, len(wantRest), p)
		}
	}
}

// TestReadIDsStopsAtOddElements puts one element readIDs does not read at
// every position of an array of 300 5-byte ids: readIDs must stop right
// there, with the ids before it read, or earlier only within the last 32
// bytes (past the last window's walk, walkTail's included), with rest
// starting at the first id not read.
func TestReadIDsStopsAtOddElements(t *testing.T) {
	for _, odd := range [][]byte{{0xcb, 0, 0, 0, 0, 0, 0, 0, 0}, {0xcf, 0, 0, 0, 0, 0, 0, 0, 1}, {0x92, 1, 2}, {0xc0}, {0xd0, 1}} {
		for at := range 300 {
			var p []byte
			for i := range 300 {
				if i == at {
					p = append(p, odd...)
					continue
				}
				p = msgp.AppendUint32(p, 70000+uint32(i))
			}
			dst := make([]uint32, 300)
			n, rest := readIDs(p, dst, new(walkScratch))
			if n > at || (5*at+32 < len(p) && n != at) {
				t.Fatalf("odd % x at %d: read %d ids", odd, at, n)
			}
			for i := range n {
				if dst[i] != 70000+uint32(i) {
					t.Fatalf("odd % x at %d: id %d = %d", odd, at, i, dst[i])
				}
			}
			next := msgp.AppendUint32(nil, 70000+uint32(n))
			if n == at {
				next = odd
			}
			if len(rest) < len(next) || !slices.Equal(rest[:len(next)], next) {
				t.Fatalf("odd % x at %d: read %d ids, rest starts % x", odd, at, n, rest[:min(len(rest), 9)])
			}
		}
	}
}

// byteWidth is the width readIDs' walk takes from a byte, one byte at a
// time: an id's whole size for a type byte it reads (fixint 1, 0xcc 2,
// 0xcd 3, 0xce 5), and 2 to 6 for any other byte of 0x80 and above, at
// which the walk stops.
func byteWidth(b byte) byte {
	if b < 0x80 {
		return 1
	}
	t := b & 3
	return 2 + t + t>>1
}

// notIDType reports whether c is not the first byte of a positive
// fixint, uint8, uint16 or uint32.
func notIDType(c byte) bool {
	return c >= 0x80 && (c < 0xcc || c > 0xce)
}

// TestWindowWidths checks the widths of every byte value, at every
// position of a window, and of random windows, from idWidths (eight
// bytes at a time), fillPairs, fillPairsGo and each assembly fill of the
// architecture (archPairs), and the fills' distances to the id after
// next; then the distances to the fourth id on from fillQuads,
// fillQuadsGo, each of archQuads, and fillWindow, which puts both
// together.
func TestWindowWidths(t *testing.T) {
	for b, want := range map[byte]byte{0x00: 1, 0x7f: 1, 0xcc: 2, 0xcd: 3, 0xce: 5} {
		if got := byteWidth(b); got != want {
			t.Fatalf("byteWidth(%#x) = %d, want %d", b, got, want)
		}
	}
	pairs := map[string]func(ws, ws2, p []byte, n int){"fillPairs": fillPairs, "fillPairsGo": fillPairsGo}
	for name, fill := range archPairs() {
		pairs[name] = fill
	}
	quads := map[string]func(w2, w4 []byte, n int){"fillQuads": fillQuads, "fillQuadsGo": fillQuadsGo}
	for name, fill := range archQuads() {
		quads[name] = fill
	}
	t.Logf("fills checked: %d of pairs, %d of quads", len(pairs), len(quads))
	rng := rand.New(rand.NewPCG(3, 4))
	for iter := range 2000 {
		p := make([]byte, idChunk+32+int(rng.IntN(16)))
		for k := range p {
			switch {
			case iter < 256:
				p[k] = byte(iter + k)
			case iter < 1000:
				// Mostly type bytes, so that ids follow ids.
				p[k] = []byte{0x05, 0xcc, 0xcd, 0xce, byte(rng.Uint32())}[rng.IntN(5)]
			default:
				p[k] = byte(rng.Uint32())
			}
		}
		// A whole window, or its first n bytes as readIDs asks for the
		// last ids of an array; the bytes past n must stay as they were.
		n := idChunk
		if iter%2 == 1 {
			n = 16 * (1 + rng.IntN(idChunk/16))
		}
		want2 := make([]byte, n+16)
		for k := range want2 {
			w := byteWidth(p[k])
			want2[k] = w + byteWidth(p[k+int(w)])
		}
		for name, fill := range pairs {
			var ws, ws2 [idChunk + 16]byte
			for k := range ws {
				ws[k], ws2[k] = 0xee, 0xee
			}
			fill(ws[:], ws2[:], p, n+16)
			for k := n + 16; k < len(ws); k++ {
				if ws[k] != 0xee || ws2[k] != 0xee {
					t.Fatalf("iteration %d: %s: a fill of %d bytes wrote byte %d", iter, name, n+16, k)
				}
			}
			for k := range n + 16 {
				want := byteWidth(p[k])
				if flag := ws[k] & notID; (flag != 0) != notIDType(p[k]) {
					t.Fatalf("iteration %d: %s: byte %d (%#x) flagged %t, want %t", iter, name, k, p[k], flag != 0, notIDType(p[k]))
				}
				if ws[k]&^notID != want {
					t.Fatalf("iteration %d: %s: byte %d (%#x) width %d, want %d", iter, name, k, p[k], ws[k], want)
				}
				if ws2[k] != want2[k] {
					t.Fatalf("iteration %d: %s: byte %d (%#x) to the id after next %d, want %d", iter, name, k, p[k], ws2[k], want2[k])
				}
			}
		}
		for name, fill := range quads {
			var w4 [idChunk]byte
			for k := range w4 {
				w4[k] = 0xee
			}
			fill(want2, w4[:], n)
			checkQuads(t, iter, name, p, want2, w4[:], n)
		}
		var win window
		for k := range win.w4 {
			win.w4[k] = 0xee
		}
		fillWindow(&win, p, n)
		checkQuads(t, iter, "fillWindow", p, want2, win.w4[:], n)
		for k := 0; k < idChunk; k += 8 {
			var word [8]byte
			binary.LittleEndian.PutUint64(word[:], idWidths(binary.LittleEndian.Uint64(p[k:])))
			for l, w := range word {
				if want := byteWidth(p[k+l]); w != want {
					t.Fatalf("iteration %d: idWidths: byte %d (%#x) width %d, want %d", iter, k+l, p[k+l], w, want)
				}
			}
		}
	}
}

// checkQuads checks w4, the distances to the fourth id on that a fill of
// n bytes wrote, against want2, the distances to the id after next.
func checkQuads(t *testing.T, iter int, name string, p, want2, w4 []byte, n int) {
	t.Helper()
	for k := range w4 {
		want := byte(0xee)
		if k < n {
			want = want2[k] + want2[k+int(want2[k])]
		}
		if w4[k] != want {
			t.Fatalf("iteration %d: %s: fill of %d bytes: byte %d (%#x) to the fourth id on %d, want %d", iter, name, n, k, p[k], w4[k], want)
		}
	}
}

// TestWalkQuadsMatchesGo compares walkQuads, in assembly where there is
// some, with walkQuadsGo on random windows of ids and odd bytes, from
// every kind of start: both must read the same ids and stop at the same
// position.
func TestWalkQuadsMatchesGo(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for iter := range 3000 {
		p := make([]byte, 8, idChunk+64)
		for len(p) < idChunk+40 {
			switch r := rng.IntN(50); {
			case r == 0 && iter%3 != 0:
				p = append(p, byte(0x80+rng.IntN(0x80))) // no id's type byte, mostly
			case r < 15:
				p = msgp.AppendUint32(p, uint32(rng.IntN(128)))
			case r < 25:
				p = msgp.AppendUint32(p, uint32(128+rng.IntN(128)))
			case r < 40:
				p = msgp.AppendUint32(p, uint32(256+rng.IntN(65000)))
			default:
				p = msgp.AppendUint32(p, uint32(65536+rng.IntN(1<<20)))
			}
		}
		var win window
		n := 16 * (1 + rng.IntN(idChunk/16))
		fillWindow(&win, p[8:], n)
		q := (*[idChunk + 8]byte)(p[:idChunk+8])
		j := uint(rng.IntN(walkStride + 8))
		ids := rng.IntN(200)
		got, want := make([]uint32, ids), make([]uint32, ids)
		gn, gj := walkQuads(&win, q, got, j)
		wn, wj := walkQuadsGo(&win, q, want, j)
		if gn != wn || gj != wj || !slices.Equal(got, want) {
			t.Fatalf("iteration %d (fill %d, from %d, %d ids): read %d to %d, want %d to %d; ids equal %v",
				iter, n, j, ids, gn, gj, wn, wj, slices.Equal(got, want))
		}
	}
}

// TestDecodeIDsMatchesReference holds decodeIDs, which reads ids 64
// bytes at a time with AVX-512, to readPlainID's ids one by one
// (R-WIRE-2): arrays of ids of one width (64 fixints fill a window),
// of every width mixed, and with an element of another encoding
// somewhere. It reads a prefix of the ids, ending where its last id
// ends, never past 128 bytes short of the array's end nor past an
// element it cannot read, and writes nothing past the ids it reports.
// Skipped where decodeIDs reads nothing (no AVX-512 VBMI, other
// architectures, purego).
func TestDecodeIDsMatchesReference(t *testing.T) {
	const sentinel = 0xdeadbeef
	rng := rand.New(rand.NewPCG(8, 9))
	widths := []uint32{0x7f, 0xff, 0xffff, math.MaxUint32}
	if !vectorIDs() {
		t.Skip("decodeIDs reads nothing in this build or on this processor")
	}
	read := 0
	for iter := range 20000 {
		n := 1 + rng.IntN(400)
		var p []byte
		offsets := []int{0}
		odd := -1
		if iter%3 == 0 {
			odd = rng.IntN(n)
		}
		w := widths[rng.IntN(len(widths))]
		mixed := iter%2 == 0
		for i := range n {
			if i == odd {
				p = appendOddToken(p, rng)
			} else {
				if mixed {
					w = widths[rng.IntN(len(widths))]
				}
				p = msgp.AppendUint32(p, uint32(rng.Int64N(int64(w)+1)))
			}
			offsets = append(offsets, len(p))
		}
		for range rng.IntN(200) {
			p = append(p, byte(rng.Uint32()))
		}
		k := rng.IntN(n) + 1
		if iter%2 == 1 {
			k = n
		}
		dst := make([]uint32, k+20)
		for i := range dst {
			dst[i] = sentinel
		}
		ids, used := decodeIDs(p, dst[:k])
		last := k
		if odd >= 0 && odd < last {
			last = odd
		}
		switch {
		case ids > last:
			t.Fatalf("iteration %d: read %d ids, past the %d it can (odd at %d, %d wanted)", iter, ids, last, odd, k)
		case used != offsets[ids]:
			t.Fatalf("iteration %d: %d ids end at %d, want %d", iter, ids, used, offsets[ids])
		case ids > 0 && used > len(p):
			t.Fatalf("iteration %d: read to %d of %d bytes", iter, used, len(p))
		}
		for i := range ids {
			want, _ := readPlainID(p[offsets[i]:])
			if dst[i] != want {
				t.Fatalf("iteration %d: id %d is %d, want %d", iter, i, dst[i], want)
			}
		}
		// dst[ids:k] is the caller's to write again; nothing past k is
		// written.
		for i := k; i < len(dst); i++ {
			if dst[i] != sentinel {
				t.Fatalf("iteration %d: wrote %d at %d, past the %d ids asked for", iter, dst[i], i, k)
			}
		}
		if ids < last && len(p)-used >= 128+64 && (odd < 0 || offsets[odd]-used >= 64) {
			t.Fatalf("iteration %d: stopped after %d of %d ids with %d bytes left", iter, ids, last, len(p)-used)
		}
		read += ids
	}
	t.Logf("%d ids read", read)
}

// BenchmarkFill is one call of each fill of this architecture on n
// bytes of real widths: a walk pays one a window, and a message's last
// ids one. On an Intel processor fillPairsWide, whose AVX2 part runs
// from n=48 on, paid about 1.1 µs a call at n=96 and 480 while it mixed
// legacy SSE instructions into its AVX2 code (each a state change of
// the upper halves); VEX-encoded throughout, 21 and 56 ns.
func BenchmarkFill(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 5))
	var p []byte
	for len(p) < 2*idChunk+64 {
		p = msgp.AppendUint32(p, uint32(rng.IntN(1<<17)))
	}
	var ws, ws2, w4 [idChunk + 32]byte
	pairs := archPairs()
	pairs["fillPairsGo"] = fillPairsGo
	quads := archQuads()
	quads["fillQuadsGo"] = fillQuadsGo
	for _, n := range []int{32, 96, 480} {
		for name, fill := range pairs {
			b.Run(fmt.Sprintf("%s/n=%d", name, n), func(b *testing.B) {
				for b.Loop() {
					fill(ws[:], ws2[:], p, n)
				}
			})
		}
		fillPairsGo(ws[:], ws2[:], p, n+16)
		for name, fill := range quads {
			b.Run(fmt.Sprintf("%s/n=%d", name, n), func(b *testing.B) {
				for b.Loop() {
					fill(ws2[:], w4[:], n)
				}
			})
		}
	}
}
