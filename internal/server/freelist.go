package server

import "sync"

// freeList keeps released buffers for reuse, up to maxBytes of them in
// all, as sized by size. Unlike a sync.Pool it hands the last buffer
// released to whichever goroutine asks next and is not emptied by
// collections, so that a steady load keeps reusing the same storage
// instead of growing new buffers now and then.
type freeList[T any] struct {
	mu       sync.Mutex
	items    []T
	bytes    int64
	maxBytes int64
	newItem  func() T
	size     func(T) int64
}

func (f *freeList[T]) get() T {
	f.mu.Lock()
	if n := len(f.items); n > 0 {
		it := f.items[n-1]
		var zero T
		f.items[n-1] = zero
		f.items = f.items[:n-1]
		f.bytes -= f.size(it)
		f.mu.Unlock()
		return it
	}
	f.mu.Unlock()
	return f.newItem()
}

// put keeps it unless that would pass maxBytes; a buffer not kept is
// left to the collector.
func (f *freeList[T]) put(it T) {
	n := f.size(it)
	f.mu.Lock()
	if f.bytes+n <= f.maxBytes {
		f.items = append(f.items, it)
		f.bytes += n
	}
	f.mu.Unlock()
}
