package server

import "sync/atomic"

// byteBudget bounds the request bytes held at once across all requests,
// so that many large bodies arriving together are refused instead of
// growing the process without limit. A nil budget admits everything.
type byteBudget struct {
	max  int64
	used atomic.Int64
}

// take reserves n bytes and reports whether they fitted.
func (b *byteBudget) take(n int64) bool {
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

// give returns n bytes taken before.
func (b *byteBudget) give(n int64) {
	if b != nil && n != 0 {
		b.used.Add(-n)
	}
}
