package main

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// record is what one request did, as the benchmark observed it.
type record struct {
	Index   int
	Session int
	Turn    int
	Prompt  int
	// Instance and DPRank served the request, from the engine's report.
	Instance string
	DPRank   int
	// DeviceHit and HostHit are the engine's own hits: prompt tokens it
	// did not recompute.
	DeviceHit int
	HostHit   int
	// The engine-reported times in wall milliseconds, and its scale.
	QueueMs, PrefillMs, DecodeMs, TimeScale float64
	// Latency is the client-observed HTTP round trip.
	Latency time.Duration
	// Decision is the routing decision time, when known (HasDecision).
	Decision    time.Duration
	HasDecision bool
	// Probe is every rank's reusable prefix (Device + Host-only tokens)
	// per engine, read from the engines just before the request was
	// sent: the best any router could have had at that moment.
	Probe [][]int
	Err   error
}

func (r *record) saved() int { return r.DeviceHit + r.HostHit }

// engineTime is the part of the round trip the engine accounts for.
func (r *record) engineTime() time.Duration {
	return time.Duration((r.QueueMs + r.PrefillMs + r.DecodeMs) * float64(time.Millisecond))
}

// sender serves one request and reports it; it must return when ctx
// ends.
type sender func(ctx context.Context, req *benchRequest) record

// loadMode is closed-loop with Concurrency clients, or open-loop at Rate
// requests per second when Rate > 0.
type loadMode struct {
	Concurrency int
	Rate        float64
	Seed        uint64
	// Timeout bounds the whole run.
	Timeout time.Duration
	// MaxErrors ends the run early once that many requests failed.
	MaxErrors int
}

// drive sends every request of w through send and returns their records
// in workload order and the wall time from the first send to the last
// answer. A session's requests go one at a time and in order, each once
// the previous one is answered, since its prompt extends the previous
// prompt and answer. Closed loop: at most Concurrency requests are in
// flight, and a free client takes the earliest request whose session is
// idle. Open loop: request i is due at its Poisson arrival time and goes
// as soon as it is due and its session idle, so at most one request per
// session is in flight.
func drive(ctx context.Context, w *workload, mode loadMode, send sender) ([]record, time.Duration, error) {
	n := len(w.requests)
	if mode.Rate <= 0 && mode.Concurrency < 1 {
		return nil, 0, fmt.Errorf("concurrency %d: need at least 1 client, or a rate", mode.Concurrency)
	}
	var due []time.Duration
	if mode.Rate > 0 {
		due = arrivals(mode.Seed, n, mode.Rate)
	}
	ctx, cancel := context.WithTimeout(ctx, mode.Timeout)
	defer cancel()

	// Per session, its requests in order; the head is the next to go.
	queues := make([][]int, w.cfg.Sessions)
	for i := range w.requests {
		s := w.requests[i].Session
		queues[s] = append(queues[s], i)
	}
	busy := make([]bool, w.cfg.Sessions)
	records := make([]record, n)
	results := make(chan record, n) // never blocks a sender
	inFlight, finished, failed := 0, 0, 0
	began := time.Now()
	var runErr error

	// next returns the earliest request that may go now, or -1, and
	// when nothing is due yet, how long until the earliest arrival of an
	// idle session.
	next := func() (int, time.Duration) {
		best, wait := -1, time.Duration(-1)
		now := time.Since(began)
		for s, q := range queues {
			if busy[s] || len(q) == 0 {
				continue
			}
			i := q[0]
			if due != nil && due[i] > now {
				if d := due[i] - now; wait < 0 || d < wait {
					wait = d
				}
				continue
			}
			if best < 0 || i < best {
				best = i
			}
		}
		return best, wait
	}

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for finished < n {
		// Launch what may go.
		for runErr == nil && (due != nil || inFlight < mode.Concurrency) {
			i, wait := next()
			if i < 0 {
				if wait >= 0 {
					timer.Reset(wait)
				}
				break
			}
			req := &w.requests[i]
			queues[req.Session] = queues[req.Session][1:]
			busy[req.Session] = true
			inFlight++
			go func() { results <- send(ctx, req) }()
		}
		if inFlight == 0 {
			if runErr == nil {
				// Nothing runs and nothing may go: only a due time is ahead.
				select {
				case <-timer.C:
					continue
				case <-ctx.Done():
					runErr = ctx.Err()
				}
			}
			break
		}
		select {
		case r := <-results:
			inFlight--
			finished++
			records[r.Index] = r
			busy[r.Session] = false
			if r.Err != nil {
				failed++
				if runErr == nil && failed >= mode.MaxErrors {
					runErr = fmt.Errorf("%d requests failed, the last: %w", failed, r.Err)
					cancel()
				}
			}
		case <-timer.C:
		case <-ctx.Done():
			if runErr == nil {
				runErr = ctx.Err()
			}
			// Collect the requests in flight; they end with ctx.
			for ; inFlight > 0; inFlight-- {
				r := <-results
				records[r.Index] = r
			}
		}
	}
	wall := time.Since(began)
	if runErr != nil {
		if errors.Is(runErr, context.DeadlineExceeded) {
			runErr = fmt.Errorf("run did not finish within %v (%d of %d answered): %w", mode.Timeout, finished, n, runErr)
		}
		return records, wall, runErr
	}
	return records, wall, nil
}
