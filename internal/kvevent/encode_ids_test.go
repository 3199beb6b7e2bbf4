package kvevent

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tinylib/msgp/msgp"
)

// TestAppendTokensMatchesMsgp compares appendTokens with msgp's own
// encoding of each id, for ids at every width's edges and random ids of
// every width, after other bytes and into buffers of every spare
// capacity: the bytes must be the same, and nothing past them written.
func TestAppendTokensMatchesMsgp(t *testing.T) {
	edges := []uint32{0, 1, 0x7e, 0x7f, 0x80, 0x81, 0xfe, 0xff, 0x100, 0x101, 0xfffe, 0xffff, 0x10000, 0x10001, 1 << 24, math.MaxUint32 - 1, math.MaxUint32}
	rng := rand.New(rand.NewPCG(9, 10))
	for iter := range 3000 {
		var ts []uint32
		switch iter % 3 {
		case 0:
			for range rng.IntN(40) {
				ts = append(ts, edges[rng.IntN(len(edges))])
			}
		case 1:
			for range rng.IntN(300) {
				ts = append(ts, uint32(rng.Uint64N(1<<uint(8*(1+rng.IntN(4))))))
			}
		default:
			for range rng.IntN(300) {
				ts = append(ts, uint32(rng.IntN(151_936)))
			}
		}
		prefix := make([]byte, rng.IntN(20), rng.IntN(20)+rng.IntN(2000)+20)
		for k := range prefix {
			prefix[k] = byte(rng.Uint32())
		}
		want := msgp.AppendArrayHeader(bytes.Clone(prefix), uint32(len(ts)))
		for _, v := range ts {
			want = msgp.AppendUint32(want, v)
		}
		got := appendTokens(prefix, ts)
		if !bytes.Equal(got, want) {
			t.Fatalf("iteration %d: %d ids: got % x, want % x", iter, len(ts), got, want)
		}
	}
}
