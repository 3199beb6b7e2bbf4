package kvdir

import (
	"sync"

	"github.com/kvcar/kvcar/internal/kvevent"
)

// batchPoolMinBytes is the smallest decode storage a stream gives back
// to its directory's pool once it has no message left to decode. A
// decode step's live messages fit in less and keep their storage; a
// snapshot's reply batches do not, and a calibration round runs many
// snapshots at once: each stream kept the storage of its last reply
// batch (some hundreds of KiB) for good.
const batchPoolMinBytes = 64 << 10

// batchPoolSize is how many batches' storage the pool keeps. Only the
// streams whose goroutines are decoding at the moment hold some, so a
// few are enough for a process; storage given back past them is left
// to the collector.
const batchPoolSize = 8

// batchPoolBytes bounds what the pool holds: batchPoolSize batches of at
// most batchRetainBytes, which trimBatch enforces before a batch is
// given back.
const batchPoolBytes = batchPoolSize * batchRetainBytes

// batchPool holds decode storage the streams gave back, for the next
// stream that decodes a large payload.
type batchPool struct {
	mu      sync.Mutex
	batches []kvevent.Batch
}

// get takes a batch's storage; ok is false when the pool has none.
func (p *batchPool) get() (b kvevent.Batch, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.batches)
	if n == 0 {
		return kvevent.Batch{}, false
	}
	b = p.batches[n-1]
	p.batches[n-1] = kvevent.Batch{}
	p.batches = p.batches[:n-1]
	return b, true
}

// put keeps b's storage, emptied, when there is room for it.
func (p *batchPool) put(b kvevent.Batch) {
	if b.StorageBytes() > batchRetainBytes {
		return
	}
	b.Reset()
	p.mu.Lock()
	if len(p.batches) < batchPoolSize {
		p.batches = append(p.batches, b)
	}
	p.mu.Unlock()
}

// held is how many batches the pool keeps, for tests.
func (p *batchPool) held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.batches)
}
