package lb

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/instance"
)

// warmCluster has tied prefill instances (three PREFILL, equal queues
// and hits) and tied decode instances, so that every decision takes a
// turn on both sides, and a DEFAULT instance with another queue.
func warmCluster() (*instance.Snapshot, *matches) {
	snap := snapshot(
		loaded("p1", P, 2, 0), loaded("p2", P, 2, 0), loaded("p3", P, 2, 0),
		loaded("f", F, 5, 0),
		loaded("d1", D, 1, 0.5), loaded("d2", D, 1, 0.5),
	)
	return snap, newMatches(match("p1", 0, 256, 0), match("p2", 0, 256, 0), match("p3", 0, 256, 0), match("f", 0, 0, 0))
}

// R-CAR-5, R-CAR-3: a dry decision changes nothing a real one decides:
// neither side's tie turn, nor, with the accounting on, the dispatches
// and pending prefixes a decision counts. Two policies route the same
// requests, one with dry decisions between them; every decision, its
// scores and reasons included, is the same.
func TestWarmChangesNoDecision(t *testing.T) {
	for _, acct := range []bool{false, true} {
		snap, view := warmCluster()
		clock := newClock()
		newPolicy := func() *CAR {
			if !acct {
				return mustCAR(t, 0.5, 0.5, view)
			}
			return acctCAR(t, 0.5, view, clock, func(o *AccountingOptions) {
				o.Dispatched, o.TokenWeight, o.PendingPrefixes, o.BlockSize = true, 0.5, true, 64
			})
		}
		plain, warmed := newPolicy(), newPolicy()
		for i := range 12 {
			req := Request{TokenIDs: tokens(256 + 64*(i%3))}
			want := route(t, plain, req, snap)
			for range 3 {
				warmed.Warm(snap)
			}
			got := route(t, warmed, req, snap)
			if got.Reason == reasonCARLowest && !acct {
				t.Fatalf("decision %d: %+v has no tie to rotate", i, got)
			}
			// Tickets count each policy's own decisions, which are the
			// same; a dry decision takes none.
			if got != want {
				t.Fatalf("accounting %v, decision %d: with dry decisions before it %+v, without %+v", acct, i, got, want)
			}
			clock.advance(10 * time.Millisecond)
		}
	}
}

// A dry decision over a snapshot without candidates ends quietly: no
// error is built, nothing is allocated.
func TestWarmWithoutCandidatesDoesNotAllocate(t *testing.T) {
	c := mustCAR(t, 0.5, 0.5, nil)
	empty := snapshot()
	suspect := snapshot(withState(loaded("a", F, 0, 0), instance.Suspect))
	for _, snap := range []*instance.Snapshot{nil, empty, suspect} {
		c.Warm(snap)
	}
	if raceEnabled {
		return
	}
	if n := testing.AllocsPerRun(100, func() { c.Warm(suspect) }); n != 0 {
		t.Fatalf("%v allocations per dry decision without candidates, want 0", n)
	}
}

// R-DIR-4: a dry decision, like a real one, allocates nothing.
func TestWarmDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	snap, view := benchCluster(64, 2, 16)
	c := mustCAR(t, 0.5, 0.5, view)
	c.Warm(snap)
	if n := testing.AllocsPerRun(100, func() { c.Warm(snap) }); n != 0 {
		t.Fatalf("%v allocations per dry decision, want 0", n)
	}
	before := view.queries.Load()
	c.Warm(snap)
	if view.queries.Load() != before+1 || view.lastLen.Load() != warmBlock {
		t.Fatalf("a dry decision made %d directory queries of %d ids, want 1 of %d", view.queries.Load()-before, view.lastLen.Load(), warmBlock)
	}
}

func TestNewKeepWarmRejects(t *testing.T) {
	c := mustCAR(t, 0.5, 0.5, nil)
	snap := func() *instance.Snapshot { return nil }
	for _, tc := range []struct{ interval, idle time.Duration }{
		{0, time.Second},
		{-time.Millisecond, time.Second},
		{MaxKeepWarmInterval + 1, 2 * MaxKeepWarmInterval},
		{time.Millisecond, time.Millisecond - 1},
	} {
		if _, err := NewKeepWarm(c, snap, tc.interval, tc.idle); err == nil {
			t.Errorf("NewKeepWarm(interval %v, idle %v): no error", tc.interval, tc.idle)
		}
	}
	if _, err := NewKeepWarm(c, snap, DefaultKeepWarmInterval, DefaultKeepWarmIdle); err != nil {
		t.Fatal(err)
	}
}

// KeepWarm starts asleep, makes dry decisions while real ones are rarer
// than its interval, sleeps once idle has passed without one and wakes
// on the next. While real decisions come without pause it makes none and
// looks ever less often; when they turn sparse again it makes dry ones
// between them. It stops with its context.
func TestKeepWarmRunsOnlyBetweenSparseDecisions(t *testing.T) {
	snap, view := benchCluster(4, 1, 2)
	c := mustCAR(t, 0.5, 0.5, view)
	const interval, idle = time.Millisecond, 40 * time.Millisecond
	k, err := NewKeepWarm(c, func() *instance.Snapshot { return snap }, interval, idle)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { k.Run(ctx) })
	defer func() {
		cancel()
		wg.Wait()
	}()

	// Asleep until the first real decision.
	time.Sleep(3 * idle)
	if n, _ := k.Warms(); n != 0 || k.looks.Load() != 0 {
		t.Fatalf("%d dry decisions and %d looks before any real one", n, k.looks.Load())
	}
	route(t, c, Request{TokenIDs: tokens(64)}, snap)
	k.Decided()
	waitWarms(t, k, 1)
	settled := waitSettled(t, k, idle)

	// A real decision wakes it again.
	route(t, c, Request{TokenIDs: tokens(64)}, snap)
	k.Decided()
	waitWarms(t, k, settled+1)
	waitSettled(t, k, idle)

	// Real decisions without pause: no dry ones, bar a few where the
	// deciding goroutine was held up, and looks that back off to one
	// every maxKeepWarmPoll (some ten in the span, where every interval
	// would be 400).
	k.Decided()
	n0, _ := k.Warms()
	looks0 := k.looks.Load()
	const span = 400 * time.Millisecond
	for end := time.Now().Add(span); time.Now().Before(end); runtime.Gosched() {
		k.Decided()
	}
	n1, _ := k.Warms()
	if n1-n0 > 20 {
		t.Fatalf("%d dry decisions in %v of real decisions without pause, want few", n1-n0, span)
	}
	if looks := k.looks.Load() - looks0; looks > uint64(span/interval)/10 {
		t.Fatalf("%d looks in %v of real decisions without pause, want it to back off", looks, span)
	}

	// Sparse real decisions again, every 5 intervals: it is back to
	// making dry ones between them.
	for range 100 {
		time.Sleep(5 * interval)
		k.Decided()
	}
	if n2, _ := k.Warms(); n2-n1 < 50 {
		t.Fatalf("%d dry decisions between 100 real ones 5 intervals apart, want most of the intervals between them", n2-n1)
	}
	if n, took := k.Warms(); n > 0 && took <= 0 {
		t.Fatalf("%d dry decisions took %v", n, took)
	}

	cancel()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// waitWarms waits until k has made at least n dry decisions.
func waitWarms(t *testing.T, k *KeepWarm, n uint64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if got, _ := k.Warms(); got >= n {
			return
		}
		if time.Now().After(deadline) {
			got, _ := k.Warms()
			t.Fatalf("%d dry decisions after 10 s, want %d", got, n)
		}
	}
}

// waitSettled waits until k has made no dry decision for three times
// idle, and returns how many it made.
func waitSettled(t *testing.T, k *KeepWarm, idle time.Duration) uint64 {
	t.Helper()
	last, _ := k.Warms()
	for deadline := time.Now().Add(20 * time.Second); ; {
		time.Sleep(3 * idle)
		n, _ := k.Warms()
		if n == last {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("still making dry decisions after 20 s without a real one (%d)", n)
		}
		last = n
	}
}

var _ Warmer = (*CAR)(nil)
