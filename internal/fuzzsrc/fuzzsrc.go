package fuzzsrc

import (
	"encoding/binary"
	"math/rand/v2"

	"github.com/zeebo/xxh3"
)

// Source gives its bytes eight at a time, little-endian, the last word
// padded with zeros. Once they run out it goes on with a generator seeded
// by them: rand's bounded draws retry on some values, and a source that
// gave only zeros from then on could make a draw retry for ever, so a
// sequence of choices always ends this way. The same bytes give the same
// words.
type Source struct {
	b    []byte
	rest *rand.PCG
}

// New returns a Source of b.
func New(b []byte) *Source {
	return &Source{b: b, rest: rand.NewPCG(uint64(len(b)), xxh3.Hash(b))}
}

// Uint64 returns the next word.
func (s *Source) Uint64() uint64 {
	if len(s.b) == 0 {
		return s.rest.Uint64()
	}
	var v [8]byte
	s.b = s.b[copy(v[:], s.b):]
	return binary.LittleEndian.Uint64(v[:])
}

// Steps is how many steps a fuzz target takes for an input of b: base,
// one more for every per bytes of it, and at most most. Bounded, so that
// the long inputs a long fuzzing run grows do not make a fixed number of
// executions, as CI runs, slow.
func Steps(b []byte, base, per, most int) int { return min(base+len(b)/per, most) }
