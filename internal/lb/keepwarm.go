package lb

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kvcar/kvcar/internal/instance"
)

// Warmer is a policy that can make a dry decision: every step of a real
// one over snap, with no effect on the decisions that follow (CAR.Warm).
type Warmer interface {
	Warm(snap *instance.Snapshot)
}

// Keep-warm limits and defaults (--car_keep_warm_interval_us).
const (
	DefaultKeepWarmInterval = time.Millisecond
	MaxKeepWarmInterval     = time.Second
	// DefaultKeepWarmIdle is how long KeepWarm goes on after the last
	// real decision before it sleeps until the next.
	DefaultKeepWarmIdle = time.Second
)

// KeepWarm makes a dry decision every interval while a router makes
// real ones less often than that, so that a real decision finds the
// code and data it reads in the processor's caches rather than in
// memory. A router that decides every few milliseconds loses them in
// between to everything else the process and the machine run: CAR's
// decision over 128 instances took 16–22 µs at the median that way
// against 8–11 µs with dry decisions every millisecond
// (docs/performance-log.md, "Keeping the decision warm").
//
// It looks every interval whether a real decision came since it last
// looked, and makes a dry one when none did. Each look wakes its
// goroutine, which on a virtual machine costs some 20 µs of CPU
// whether or not it then works, so while real decisions come at least
// once an interval on average (they keep the caches warm themselves) it
// looks ever less often, down to once every maxKeepWarmPoll, and back at
// every interval as soon as they come less often. After idle without a
// real decision it sleeps until the next one (Decided), so an idle
// router does no work.
//
// A dry decision warms the caches of the core it runs on; with more
// than one core the real decision may run on another, where only what
// the cores share (the last-level cache) is warmed.
type KeepWarm struct {
	w        Warmer
	snapshot func() *instance.Snapshot
	interval time.Duration
	idle     time.Duration

	// decisions counts the real decisions since Run last looked.
	decisions atomic.Uint64
	// asleep is set while Run waits for wake.
	asleep atomic.Bool
	wake   chan struct{}

	warms atomic.Uint64
	busy  atomic.Int64 // ns spent in dry decisions
	looks atomic.Uint64
}

// maxKeepWarmPoll is the longest KeepWarm waits between two looks while
// real decisions come often: it bounds both its wake-ups then (8 a
// second) and how long real decisions that turn sparse go without dry
// ones between them.
const maxKeepWarmPoll = 128 * time.Millisecond

// NewKeepWarm returns a KeepWarm that makes w's dry decisions over the
// snapshot snapshot returns, every interval (in (0, MaxKeepWarmInterval])
// until idle (at least interval) passes without a real decision.
func NewKeepWarm(w Warmer, snapshot func() *instance.Snapshot, interval, idle time.Duration) (*KeepWarm, error) {
	if interval <= 0 || interval > MaxKeepWarmInterval {
		return nil, fmt.Errorf("lb: keep-warm interval %v is outside (0, %v]", interval, MaxKeepWarmInterval)
	}
	if idle < interval {
		return nil, fmt.Errorf("lb: keep-warm idle time %v is shorter than its interval %v", idle, interval)
	}
	return &KeepWarm{w: w, snapshot: snapshot, interval: interval, idle: idle, wake: make(chan struct{}, 1)}, nil
}

// Decided tells k that a real decision was made. It is meant for the
// request path: an atomic add and a load, and a send only when k sleeps.
func (k *KeepWarm) Decided() {
	k.decisions.Add(1)
	if k.asleep.Load() {
		select {
		case k.wake <- struct{}{}:
		default:
		}
	}
}

// Warms returns the dry decisions made so far and the time they took.
func (k *KeepWarm) Warms() (n uint64, took time.Duration) {
	return k.warms.Load(), time.Duration(k.busy.Load())
}

// Run makes the dry decisions until ctx ends, starting asleep until the
// first real decision. Its caller owns the goroutine it runs on.
func (k *KeepWarm) Run(ctx context.Context) {
	if !k.sleep(ctx) {
		return
	}
	period := k.interval
	t := time.NewTimer(period)
	defer t.Stop()
	var quiet time.Duration
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		k.looks.Add(1)
		switch n := k.decisions.Swap(0); {
		case n == 0:
			if quiet += period; quiet >= k.idle {
				if !k.sleep(ctx) {
					return
				}
				quiet, period = 0, k.interval
				break
			}
			start := time.Now()
			k.w.Warm(k.snapshot())
			k.busy.Add(int64(time.Since(start)))
			k.warms.Add(1)
			period = k.interval
		case time.Duration(n)*k.interval >= period:
			// At least one real decision an interval, on average.
			quiet = 0
			period = min(2*period, max(maxKeepWarmPoll, k.interval))
		default:
			quiet = 0
			period = k.interval
		}
		t.Reset(period)
	}
}

// sleep waits for the next real decision; false when ctx ended first.
func (k *KeepWarm) sleep(ctx context.Context) bool {
	// A decision between the look and asleep being set is seen by the
	// check after it; one after it sends on wake.
	k.asleep.Store(true)
	defer k.asleep.Store(false)
	if k.decisions.Load() == 0 {
		select {
		case <-ctx.Done():
			return false
		case <-k.wake:
		}
	}
	// A wake sent for a decision the check above already saw would end
	// the next sleep at once.
	select {
	case <-k.wake:
	default:
	}
	return true
}
