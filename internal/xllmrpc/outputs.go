package xllmrpc

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"google.golang.org/protobuf/proto"

	"github.com/kvcar/kvcar/internal/budget"
	"github.com/kvcar/kvcar/internal/xllmpb"
)

// DefaultMaxQueuedOutputBytes bounds the generations queued for one
// request that its reader has not taken yet.
const DefaultMaxQueuedOutputBytes = 4 << 20

// DefaultMaxAllQueuedOutputBytes bounds the generations queued for all
// requests together.
const DefaultMaxAllQueuedOutputBytes = 256 << 20

// Outputs is the registry of requests waiting for their engines'
// Generations, by service_request_id. Generations calls deliver into it;
// each dispatched request reads its own queue. Safe for concurrent use.
type Outputs struct {
	maxBytes int64
	// all counts what every queue holds, against its own bound.
	all *budget.Bytes

	mu sync.Mutex
	m  map[string]*outputQueue
}

// NewOutputs makes an empty registry. perRequest bounds each request's
// queue (0: DefaultMaxQueuedOutputBytes) and all the queues together (0:
// DefaultMaxAllQueuedOutputBytes), both in the bytes the generations
// hold decoded (heldBytes).
func NewOutputs(perRequest, all int64) *Outputs {
	if perRequest <= 0 {
		perRequest = DefaultMaxQueuedOutputBytes
	}
	if all <= 0 {
		all = DefaultMaxAllQueuedOutputBytes
	}
	return &Outputs{maxBytes: perRequest, all: budget.New(all), m: make(map[string]*outputQueue)}
}

// errBacklog ends a request whose reader fell behind by more than the
// queue's budget; errAllQueues one whose output found every queue's
// budget spent.
var (
	errBacklog   = errors.New("the request's output backlog exceeded its limit: the client reads too slowly")
	errAllQueues = errors.New("the output queued for all requests reached kvcar's limit (--rpc_max_queued_output_bytes)")
)

// outputQueue holds one request's undelivered generations.
type outputQueue struct {
	max    int64
	all    *budget.Bytes
	notify chan struct{} // a token when something was queued or the queue failed

	mu     sync.Mutex
	gens   []*xllmpb.DisaggStreamGeneration
	bytes  int64 // taken from all for gens
	err    error // set once: the queue takes nothing more
	closed bool
}

// Len is the number of requests waiting for output.
func (o *Outputs) Len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.m)
}

// QueuedBytes is what the generations queued for all requests hold.
func (o *Outputs) QueuedBytes() int64 { return o.all.Used() }

// MaxQueuedBytes is QueuedBytes' bound.
func (o *Outputs) MaxQueuedBytes() int64 { return o.all.Max() }

// open registers the request id; an id already waiting is refused, as
// xllm-service refuses it.
func (o *Outputs) open(id string) (*outputQueue, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, dup := o.m[id]; dup {
		return nil, fmt.Errorf("service_request_id %q is already waiting for output", id)
	}
	q := &outputQueue{max: o.maxBytes, all: o.all, notify: make(chan struct{}, 1)}
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
	q.drop()
	q.mu.Unlock()
}

// drop lets go of the queued generations. The caller holds q.mu.
func (q *outputQueue) drop() {
	q.gens = nil
	q.all.Give(q.bytes)
	q.bytes = 0
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
	size := heldBytes(gen)
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || q.err != nil {
		return false
	}
	switch {
	// The per-request bound is on a backlog: a generation larger than it
	// (a long answer with log probabilities, not streamed) is taken into
	// an empty queue, its decode having fit the rpc port's budget.
	case q.bytes > 0 && q.bytes+size > q.max:
		q.err = errBacklog
	case !q.all.Take(size):
		q.err = errAllQueues
	default:
		q.gens = append(q.gens, gen)
		q.bytes += size
		q.wake()
		return true
	}
	q.drop()
	q.wake()
	return false
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
	// The reader writes the generations out and lets them go.
	gens := q.gens
	q.drop()
	return gens, nil
}

// heldBytes bounds what a decoded generation holds. Its wire size does
// not: an empty SequenceOutput is 2 bytes sent and a struct of over a
// hundred decoded, and a one-byte token id takes 4. So each of its
// messages, slices, strings and unknown fields counts at what its
// allocation takes.
func heldBytes(g *xllmpb.DisaggStreamGeneration) int64 {
	n := msgBytes(g, genSize) + strBytes(g.ReqId) + strBytes(g.ServiceReqId) + sliceBytes(cap(g.Outputs), ptrSize)
	if st := g.GenStatus; st != nil {
		n += msgBytes(st, statusSize) + strBytes(st.StatusMsg)
	}
	if g.Usage != nil {
		n += msgBytes(g.Usage, usageSize)
	}
	for _, o := range g.Outputs {
		if o == nil {
			continue
		}
		n += msgBytes(o, outputSize) + strBytes(o.Text) + strBytes(o.FinishReason) +
			sliceBytes(cap(o.TokenIds), 4) + sliceBytes(cap(o.Logprobs), ptrSize)
		for _, lp := range o.Logprobs {
			if lp == nil {
				continue
			}
			n += msgBytes(lp, logProbSize) + dataBytes(lp.LogProbData) + sliceBytes(cap(lp.TopLogprobs), ptrSize)
			for _, d := range lp.TopLogprobs {
				n += dataBytes(d)
			}
		}
	}
	return n
}

const (
	genSize     = int64(unsafe.Sizeof(xllmpb.DisaggStreamGeneration{}))
	statusSize  = int64(unsafe.Sizeof(xllmpb.GenerationStatus{}))
	usageSize   = int64(unsafe.Sizeof(xllmpb.OutputUsage{}))
	outputSize  = int64(unsafe.Sizeof(xllmpb.SequenceOutput{}))
	logProbSize = int64(unsafe.Sizeof(xllmpb.LogProb{}))
	dataSize    = int64(unsafe.Sizeof(xllmpb.LogProbData{}))
	ptrSize     = int64(unsafe.Sizeof(uintptr(0)))
)

func dataBytes(d *xllmpb.LogProbData) int64 {
	if d == nil {
		return 0
	}
	return msgBytes(d, dataSize) + strBytes(d.Token)
}

// msgBytes is a message's struct and the unknown fields it keeps.
func msgBytes(m proto.Message, size int64) int64 {
	n := budget.AllocSize(size)
	if u := m.ProtoReflect().GetUnknown(); len(u) > 0 {
		n += budget.AllocSize(int64(cap(u)))
	}
	return n
}

func strBytes(s string) int64 {
	if s == "" {
		return 0
	}
	return budget.AllocSize(int64(len(s)))
}

func sliceBytes(n int, elem int64) int64 {
	if n == 0 {
		return 0
	}
	return budget.AllocSize(int64(n) * elem)
}
