package budget

import "sync/atomic"

// Bytes is a budget of max bytes. A nil *Bytes admits everything.
type Bytes struct {
	max  int64
	used atomic.Int64
}

// New returns a budget of max bytes.
func New(max int64) *Bytes { return &Bytes{max: max} }

// Take reserves n bytes and reports whether they fitted; a refusal
// reserves nothing.
func (b *Bytes) Take(n int64) bool {
	if b == nil {
		return true
	}
	for {
		u := b.used.Load()
		if u+n > b.max {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// Give returns n bytes taken before.
func (b *Bytes) Give(n int64) {
	if b != nil && n != 0 {
		b.used.Add(-n)
	}
}

// Used returns the bytes taken and not yet given back.
func (b *Bytes) Used() int64 {
	if b == nil {
		return 0
	}
	return b.used.Load()
}

// Max returns the budget's size.
func (b *Bytes) Max() int64 {
	if b == nil {
		return 0
	}
	return b.max
}

// AllocSize bounds what an allocation of n bytes holds: Go's size
// classes waste at most an eighth of a large object, and up to 15 bytes
// of a small one (33 bytes take 48).
func AllocSize(n int64) int64 { return n + n/4 + 16 }
