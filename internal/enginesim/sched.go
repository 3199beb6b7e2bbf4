package enginesim

import (
	"container/list"
	"context"
	"errors"
	"sync"
	"time"
)

// Admission outcomes that are not a slot.
var (
	// errNotServing: the engine is stopped or between two processes.
	errNotServing = errors.New("engine is not serving")
	// errOverloaded: MaxQueue requests already wait.
	errOverloaded = errors.New("engine overloaded: waiting queue is full")
	// errAborted: the process the request was admitted by has gone
	// (Restart, RestartWithDPSize, Close).
	errAborted = errors.New("engine process ended")
)

// EngineStats counts the inference requests served over HTTP since the
// engine was created or ResetStats. Restart keeps them: they describe the
// emulated instance over a benchmark, not one process. Direct Prefill
// calls are not requests and are not counted.
type EngineStats struct {
	// Requests is the number of requests that got a slot and were
	// prefilled; the token counters below add up over them.
	Requests uint64
	// Completed is the number of requests answered in full.
	Completed uint64
	// PromptTokens, DeviceHitTokens and HostHitTokens add up the prompt
	// length and the engine's own prefix hits per tier, so that
	// (DeviceHitTokens+HostHitTokens)/PromptTokens is the hit rate a
	// router achieved.
	PromptTokens    uint64
	DeviceHitTokens uint64
	HostHitTokens   uint64
	// CompletionTokens is the number of output tokens produced.
	CompletionTokens uint64
	// Cancelled counts requests whose client went away while they
	// waited or ran; each freed its place at once.
	Cancelled uint64
	// Rejected counts 503 answers because MaxQueue requests waited.
	Rejected uint64
	// BadRequests counts 4xx answers to malformed requests.
	BadRequests uint64
	// Failed counts answers forced by SetFailRequests.
	Failed uint64
	// Aborted counts requests cut off by Restart, RestartWithDPSize or
	// Close, whose connections were dropped as a dying process's are.
	Aborted uint64
	// Misrouted counts requests whose prefill name, from the body or the
	// header, is not this instance's name.
	Misrouted uint64
	// Decoded counts requests another instance prefilled and handed over
	// here for their decode (baidu_std requests with a decode instance).
	Decoded uint64
	// Waiting and Running are the requests queued for a slot and holding
	// one now.
	Waiting int
	Running int
	// QueueTime, PrefillTime and DecodeTime add up the wall-clock times
	// reported per request (after TimeScale), so that their means over
	// Requests give the emulated TTFT of a run.
	QueueTime   time.Duration
	PrefillTime time.Duration
	DecodeTime  time.Duration
}

// serving is the request side of an Engine: one FIFO queue of batch slots
// per DP rank, the rank rotation and the counters. It starts no
// goroutine: a request is served by its HTTP handler goroutine, which
// waits on its own channel for a slot. mu is a leaf lock: nothing is
// called under it that takes another lock of the engine.
type serving struct {
	mu    sync.Mutex
	gen   *generation // nil while not serving
	rr    int
	seq   uint64 // response ids
	stats EngineStats
}

// generation is one engine process's request side. Restart and Close end
// it; its requests then abort, and a new process starts with empty
// queues.
type generation struct {
	ctx      context.Context
	cancel   context.CancelFunc
	slots    int
	maxQueue int
	queues   []*rankQueue
	waiting  int // over all queues
}

type rankQueue struct {
	running int
	waiters list.List // of *waiter, oldest first
}

// waiter is a request waiting for a slot of one rank.
type waiter struct {
	ready   chan struct{} // closed when granted
	granted bool
	elem    *list.Element
}

// ticket is one admitted request; done must be called once it ends.
type ticket struct {
	s       *serving
	g       *generation
	dp      int
	w       *waiter
	holding bool
	start   time.Time
}

// start opens a new generation of dpSize empty queues.
func (s *serving) start(dpSize, slots, maxQueue int) {
	ctx, cancel := context.WithCancel(context.Background())
	g := &generation{ctx: ctx, cancel: cancel, slots: slots, maxQueue: maxQueue, queues: make([]*rankQueue, dpSize)}
	for i := range g.queues {
		g.queues[i] = &rankQueue{}
	}
	s.mu.Lock()
	old := s.gen
	s.gen = g
	s.mu.Unlock()
	if old != nil {
		old.cancel()
	}
}

// stop ends the current generation: its requests abort, and new ones are
// refused until start.
func (s *serving) stop() {
	s.mu.Lock()
	g := s.gen
	s.gen = nil
	s.mu.Unlock()
	if g != nil {
		g.cancel()
	}
}

// admit places a request on the least loaded rank, counting running and
// queued requests, ties going to the next rank in rotation so that no
// rank is always preferred. The request gets a slot at once when the rank
// has a free one and nobody waits for it; otherwise it joins the rank's
// queue, unless MaxQueue requests already wait.
func (s *serving) admit() (*ticket, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.gen
	if g == nil {
		return nil, errNotServing
	}
	n := len(g.queues)
	dp, best := 0, -1
	for i := range n {
		cand := (s.rr + i) % n
		q := g.queues[cand]
		if load := q.running + q.waiters.Len(); best < 0 || load < best {
			dp, best = cand, load
		}
	}
	q := g.queues[dp]
	t := &ticket{s: s, g: g, dp: dp, start: time.Now()}
	if q.running < g.slots && q.waiters.Len() == 0 {
		q.running++
		t.holding = true
	} else {
		if g.waiting >= g.maxQueue {
			s.stats.Rejected++
			return nil, errOverloaded
		}
		t.w = &waiter{ready: make(chan struct{})}
		t.w.elem = q.waiters.PushBack(t.w)
		g.waiting++
	}
	s.rr = (s.rr + 1) % n
	return t, nil
}

// wait blocks until the ticket holds a slot and returns how long it
// waited: 0 for a request that never queued. It fails with ctx's error
// when the client goes away first, or errAborted when the process ends.
func (t *ticket) wait(ctx context.Context) (time.Duration, error) {
	if t.holding {
		return 0, nil
	}
	var err error
	select {
	case <-t.w.ready:
	case <-ctx.Done():
		err = ctx.Err()
	case <-t.g.ctx.Done():
		err = errAborted
	}
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	if t.w.granted {
		// Granted, possibly at the same moment as the failure: the slot
		// is ours and done hands it on.
		t.holding = true
	} else {
		t.g.queues[t.dp].waiters.Remove(t.w.elem)
		t.g.waiting--
	}
	return time.Since(t.start), err
}

// done releases the slot, handing it to the oldest waiter of the rank.
func (t *ticket) done() {
	if !t.holding {
		return
	}
	t.holding = false
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	q := t.g.queues[t.dp]
	if front := q.waiters.Front(); front != nil {
		w := q.waiters.Remove(front).(*waiter)
		w.granted = true
		t.g.waiting--
		close(w.ready)
		return
	}
	q.running--
}

// count applies fn to the counters.
func (s *serving) count(fn func(*EngineStats)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fn(&s.stats)
}

func (s *serving) nextID() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	return s.seq
}

// waitingNow is the number of requests of the current process that wait
// for a slot.
func (s *serving) waitingNow() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gen == nil {
		return 0
	}
	return s.gen.waiting
}

func (s *serving) snapshot() EngineStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	if g := s.gen; g != nil {
		st.Waiting = g.waiting
		for _, q := range g.queues {
			st.Running += q.running
		}
	}
	return st
}

// Stats returns the request counters and the current queue.
func (e *Engine) Stats() EngineStats { return e.serve.snapshot() }

// ResetStats zeroes the request counters, for a benchmark that measures
// after a warm-up. The current queue is not touched.
func (e *Engine) ResetStats() { e.serve.count(func(st *EngineStats) { *st = EngineStats{} }) }
