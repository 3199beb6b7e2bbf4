package xllmrpc

import (
	"errors"
	"fmt"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/kvcar/kvcar/internal/xllmpb"
)

// DefaultMaxQueuedOutputBytes bounds the generations queued for one
// request that its reader has not taken yet.
const DefaultMaxQueuedOutputBytes = 4 << 20

// Outputs is the registry of requests waiting for their engines'
// Generations, by service_request_id. Generations calls deliver into it;
// each dispatched request reads its own queue. Safe for concurrent use.
type Outputs struct {
	maxBytes int

	mu sync.Mutex
	m  map[string]*outputQueue
}

// NewOutputs makes an empty registry; maxBytes bounds each request's
// queue (0: DefaultMaxQueuedOutputBytes).
func NewOutputs(maxBytes int) *Outputs {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxQueuedOutputBytes
	}
	return &Outputs{maxBytes: maxBytes, m: make(map[string]*outputQueue)}
}

// errBacklog ends a request whose reader fell behind by more than the
// queue's budget.
var errBacklog = errors.New("the request's output backlog exceeded its limit: the client reads too slowly")

// outputQueue holds one request's undelivered generations.
type outputQueue struct {
	max    int
	notify chan struct{} // a token when something was queued or the queue failed

	mu     sync.Mutex
	gens   []*xllmpb.DisaggStreamGeneration
	bytes  int
	err    error // set once: the queue takes nothing more
	closed bool
}

// Len is the number of requests waiting for output.
func (o *Outputs) Len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.m)
}

// open registers the request id; an id already waiting is refused, as
// xllm-service refuses it.
func (o *Outputs) open(id string) (*outputQueue, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, dup := o.m[id]; dup {
		return nil, fmt.Errorf("service_request_id %q is already waiting for output", id)
	}
	q := &outputQueue{max: o.maxBytes, notify: make(chan struct{}, 1)}
	o.m[id] = q
	return q, nil
}

// close forgets the request: later generations for it are refused, which
// tells the engine to stop it.
func (o *Outputs) close(id string, q *outputQueue) {
	o.mu.Lock()
	if o.m[id] == q {
		delete(o.m, id)
	}
	o.mu.Unlock()
	q.mu.Lock()
	q.closed = true
	q.gens = nil
	q.mu.Unlock()
}

// Deliver queues one generation for its request and reports whether the
// request takes it: false for an unknown service_req_id, a request that
// has ended, or one whose queue is over budget (which then ends with an
// error). It never blocks on the request's reader.
func (o *Outputs) Deliver(gen *xllmpb.DisaggStreamGeneration) bool {
	o.mu.Lock()
	q := o.m[gen.GetServiceReqId()]
	o.mu.Unlock()
	if q == nil {
		return false
	}
	return q.push(gen)
}

func (q *outputQueue) push(gen *xllmpb.DisaggStreamGeneration) bool {
	size := proto.Size(gen)
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || q.err != nil {
		return false
	}
	if q.bytes+size > q.max {
		q.err = errBacklog
		q.gens = nil
		q.wake()
		return false
	}
	q.gens = append(q.gens, gen)
	q.bytes += size
	q.wake()
	return true
}

func (q *outputQueue) wake() {
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// take returns every queued generation, or the queue's error once it has
// failed; both empty means wait on notify.
func (q *outputQueue) take() ([]*xllmpb.DisaggStreamGeneration, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err != nil {
		return nil, q.err
	}
	gens := q.gens
	q.gens, q.bytes = nil, 0
	return gens, nil
}
