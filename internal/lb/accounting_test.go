package lb

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/instance"
	"github.com/kvcar/kvcar/internal/kvdir"
)

// fakeClock is the accounting's clock in these tests.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time               { return c.t }
func (c *fakeClock) advance(d time.Duration)      { c.t = c.t.Add(d) }
func newClock() *fakeClock                        { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }
func (c *fakeClock) at(d time.Duration) time.Time { return c.t.Add(d) }

func acctCAR(t *testing.T, lambda float64, view PrefixView, clock *fakeClock, edit func(*AccountingOptions)) *CAR {
	t.Helper()
	c := mustCAR(t, lambda, 0.5, view)
	o := DefaultAccountingOptions()
	o.Now = clock.now
	edit(&o)
	if err := c.EnableAccounting(o); err != nil {
		t.Fatal(err)
	}
	return c
}

// loadedOf is the time since base of in's load report, as a decision
// reads it from its brief.
func (a *accounting) loadedOf(in *instance.Instance) int64 {
	if in.LoadUpdated.IsZero() {
		return noLoad
	}
	return a.since(in.LoadUpdated)
}

// registeredAt gives an instance the registration time that names its
// incarnation to the accounting, and a load report received at seen.
func registeredAt(in instance.Instance, reg, seen time.Time) instance.Instance {
	in.Registered = reg
	in.LoadUpdated = seen
	return in
}

func fleet(clock *fakeClock, names ...string) []instance.Instance {
	out := make([]instance.Instance, len(names))
	for i, n := range names {
		out[i] = registeredAt(loaded(n, instance.Default, 0, 0), clock.at(-time.Hour), clock.at(-time.Second))
	}
	return out
}

// A burst of requests whose prefix one instance holds: the seed's
// formula sends every one there, as no load report arrives in between;
// dispatch accounting adds each dispatch to that instance's queue term,
// so the burst spreads (R-CAR-3, issue 14 item 3a).
func TestAccountingBurstDoesNotHerd(t *testing.T) {
	clock := newClock()
	view := newMatches(match("a", 0, 1024, 0), match("b", 0, 0, 0), match("c", 0, 0, 0), match("d", 0, 0, 0))
	snap := snapshot(fleet(clock, "a", "b", "c", "d")...)
	req := Request{TokenIDs: tokens(1024)}

	count := func(p Policy) map[string]int {
		got := map[string]int{}
		for range 8 {
			got[route(t, p, req, snap).Prefill]++
			clock.advance(time.Millisecond)
		}
		return got
	}
	if got := count(mustCAR(t, 0.5, 0.5, view)); got["a"] != 8 {
		t.Fatalf("seed formula: %v, want all 8 on a", got)
	}
	got := count(acctCAR(t, 0.5, view, clock, func(o *AccountingOptions) { o.Dispatched = true }))
	// a wins the first; from then on, as the longest queue, its queue
	// term is 1, so its cost (0.5) ties the empty instances' (0.5, all
	// miss) and ties rotate; an instance with one request sent costs
	// more than a while a has more. So a keeps the largest share, but
	// not the burst.
	if got["a"] == 8 || len(got) < 3 {
		t.Fatalf("with accounting: %v, want the burst spread over at least three instances", got)
	}
	t.Logf("burst of 8 with accounting: %v", got)
}

// The arithmetic of the queue term: waiting + sent over the maximum,
// blended with the uncached tokens by β.
func TestAccountingQueueTerm(t *testing.T) {
	clock := newClock()
	a := registeredAt(loaded("a", instance.Default, 2, 0), clock.at(-time.Hour), clock.at(-time.Second))
	b := registeredAt(loaded("b", instance.Default, 0, 0), clock.at(-time.Hour), clock.at(-time.Second))
	snap := snapshot(a, b)
	c := acctCAR(t, 0, nil, clock, func(o *AccountingOptions) { o.Dispatched = true; o.TokenWeight = 0.25 })

	// Without a view, the hit is 0 and uncached tokens are the prompt's.
	d := route(t, c, Request{PromptTokens: 300}, snap) // b: 0 < 1
	wantRoute(t, d, "b", "")
	wantFloat(t, "first score", d.PrefillScore, 0)
	d = route(t, c, Request{PromptTokens: 100}, snap) // a 2/2, b 1/2 + tokens 300/300
	wantRoute(t, d, "b", "")
	wantFloat(t, "second score", d.PrefillScore, 0.75*0.5+0.25*1)
	// Now b has 2 sent, 400 tokens; a 2 waiting, none: a = 0.75·1, b = 0.75·1 + 0.25.
	d = route(t, c, Request{PromptTokens: 100}, snap)
	wantRoute(t, d, "a", "")
	wantFloat(t, "third score", d.PrefillScore, 0.75)

	acct := c.acct
	now := acct.since(clock.now())
	r, tok := acct.outstanding(1, acct.loadedOf(&snap.Instances[1]), now)
	if r != 2 || tok != 400 {
		t.Fatalf("b outstanding = %v requests, %v tokens; want 2, 400", r, tok)
	}
}

// A load report received after a dispatch supersedes it; one received
// less than HeartbeatLag after it does not; with no report a dispatch
// stops counting after DispatchMaxAge.
func TestAccountingHeartbeatSupersedes(t *testing.T) {
	clock := newClock()
	reg := clock.at(-time.Hour)
	in := registeredAt(loaded("a", instance.Default, 0, 0), reg, clock.at(-time.Second))
	o := DefaultAccountingOptions()
	o.Dispatched, o.Now = true, clock.now
	o.HeartbeatLag = 5 * time.Millisecond
	o.DispatchMaxAge = time.Second
	acct := newAccounting(o)
	acct.sync(snapshot(in))
	st := acct.stateOrNew(0, &in)
	for _, ms := range []int{0, 10, 20} {
		acct.recordDispatch(st, acct.since(clock.at(time.Duration(ms)*time.Millisecond)), 1, uint64(ms+1))
	}
	now := acct.since(clock.at(30 * time.Millisecond))
	check := func(what string, want float64) {
		t.Helper()
		if r, _ := acct.outstanding(0, acct.loadedOf(&in), now); r != want {
			t.Fatalf("%s: %v outstanding, want %v", what, r, want)
		}
	}
	check("report before every dispatch", 3)
	in.LoadUpdated = clock.at(12 * time.Millisecond) // supersedes t ≤ 7 ms
	check("report at 12 ms, lag 5 ms", 2)
	in.LoadUpdated = clock.at(25 * time.Millisecond) // supersedes t ≤ 20 ms
	check("report at 25 ms", 0)

	acct.recordDispatch(st, acct.since(clock.at(40*time.Millisecond)), 1, 41)
	check("dispatch after the report", 1)
	now = acct.since(clock.at(1040 * time.Millisecond))
	check("past the max age", 0)
}

// An instance's accounting against a plain list of its dispatches,
// through random dispatches, load reports, releases and clock steps: the
// ring wraps and overflows its cap, the counts come from the suffix
// search and the expiry from the oldest and newest times, so every path
// of outstanding is checked against the definition in the package doc.
func TestAccountingMatchesAList(t *testing.T) {
	type rec struct {
		at     int64
		tokens float64
		ticket uint64
		live   bool
	}
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		clock := newClock()
		o := DefaultAccountingOptions()
		o.Dispatched, o.Now = true, clock.now
		o.HeartbeatLag = time.Duration(rng.IntN(20)) * time.Millisecond
		o.DispatchMaxAge = time.Duration(20+rng.IntN(200)) * time.Millisecond
		o.MaxPendingDispatches = 1 + rng.IntN(64)
		acct := newAccounting(o)
		in := registeredAt(loaded("a", instance.Default, 0, 0), clock.at(-time.Hour), time.Time{})
		acct.sync(snapshot(in))
		st := acct.stateOrNew(0, &in)
		var list []rec
		ticket := uint64(0)
		for step := range 3000 {
			// Whole milliseconds, so that times meet the cuts exactly.
			clock.advance(time.Duration(rng.IntN(3)) * time.Millisecond)
			now := acct.since(clock.now())
			switch op := rng.IntN(10); {
			case op < 5:
				ticket++
				tok := float64(rng.IntN(4000)) / 4
				acct.recordDispatch(st, now, tok, ticket)
				if list = append(list, rec{now, tok, ticket, true}); len(list) > o.MaxPendingDispatches {
					list = list[1:]
				}
			case op < 6:
				in.LoadUpdated = clock.at(-time.Duration(rng.IntN(40)) * time.Millisecond)
			case op < 8 && ticket > 0:
				tk := ticket - uint64(rng.IntN(int(min(ticket, 80))))
				acct.release("a", tk)
				for i := range list {
					if list[i].ticket == tk {
						list[i].live = false
					}
				}
			}
			old := now - int64(o.DispatchMaxAge)
			for len(list) > 0 && list[0].at <= old {
				list = list[1:]
			}
			cut := old
			if !in.LoadUpdated.IsZero() {
				cut = max(cut, acct.since(in.LoadUpdated)-int64(o.HeartbeatLag))
			}
			wantReqs, wantToks := 0.0, 0.0
			for _, r := range list {
				if r.at > cut {
					wantReqs++
				}
				if r.live {
					wantToks += r.tokens
				}
			}
			reqs, toks := acct.outstanding(0, acct.loadedOf(&in), now)
			if reqs != wantReqs || math.Abs(toks-wantToks) > 1e-6 {
				t.Fatalf("seed %d step %d: %v requests, %v tokens; the list says %v, %v (%d dispatches held)",
					seed, step, reqs, toks, wantReqs, wantToks, st.dispatches.size)
			}
			if acct.sums[0] != st.sum() {
				t.Fatalf("seed %d step %d: the decision reads %+v, the state has %+v", seed, step, acct.sums[0], st.sum())
			}
			if st.dispatches.size != len(list) {
				t.Fatalf("seed %d step %d: the ring holds %d dispatches, the list %d", seed, step, st.dispatches.size, len(list))
			}
		}
	}
}

// A request with the prefix of one routed a moment ago goes to the same
// instance before the engine's events report it; the decision and the
// directory still say nothing is cached there (issue 14 item 3b).
func TestPendingPrefixFollowsFirstRequest(t *testing.T) {
	clock := newClock()
	view := newMatches(match("a", 0, 0, 0), match("b", 0, 0, 0), match("c", 0, 0, 0))
	snap := snapshot(fleet(clock, "a", "b", "c")...)
	c := acctCAR(t, 0.5, view, clock, func(o *AccountingOptions) {
		o.PendingPrefixes, o.BlockSize, o.PendingTimeout = true, 16, time.Second
	})
	first := route(t, c, Request{TokenIDs: tokens(64)}, snap)
	for i := range 3 {
		clock.advance(10 * time.Millisecond)
		// The same 64 tokens and 32 more: 4 of 6 blocks are pending.
		d := route(t, c, Request{TokenIDs: tokens(96)}, snap)
		if i == 0 {
			wantRoute(t, d, first.Prefill, "")
			wantFloat(t, "HitRatio (the directory's)", d.HitRatio, 0)
			wantFloat(t, "score", d.PrefillScore, 0.5*(1-64.0/96))
		}
	}
	// The directory was never told anything.
	_, hits := view.Hits(tokens(96), nil)
	for _, h := range hits {
		if h.DeviceTokens != 0 || h.HostOnlyTokens != 0 {
			t.Fatalf("directory hit changed: %+v", h)
		}
	}
	// Past the timeout nothing is pending: ties rotate again.
	clock.advance(2 * time.Second)
	seen := map[string]bool{}
	for range 3 {
		d := route(t, c, Request{TokenIDs: append(tokens(64), 7, 7, 7)}, snap)
		seen[d.Prefill] = true
		clock.advance(2 * time.Second)
	}
	if len(seen) != 3 {
		t.Fatalf("after the timeout requests went to %v, want all three in turn", seen)
	}
}

// Once the directory reports the blocks, they stop being pending: an
// eviction the events report later is not hidden by them.
func TestPendingPrefixConfirmedByDirectory(t *testing.T) {
	clock := newClock()
	snap := snapshot(fleet(clock, "a", "b")...)
	view := &switchView{}
	view.set(match("a", 0, 0, 0), match("b", 0, 0, 0))
	c := acctCAR(t, 1, view, clock, func(o *AccountingOptions) { o.PendingPrefixes, o.BlockSize = true, 16 })
	first := route(t, c, Request{TokenIDs: tokens(64)}, snap)
	st := c.acct.insts[first.Prefill]
	if len(st.pending) != 4 {
		t.Fatalf("%d pending blocks, want 4", len(st.pending))
	}
	view.set(match(first.Prefill, 0, 64, 0), match(other(first.Prefill), 0, 0, 0))
	route(t, c, Request{TokenIDs: tokens(64)}, snap)
	if len(st.pending) != 0 {
		t.Fatalf("%d pending blocks after the directory reported them, want 0", len(st.pending))
	}
	// The engine evicts them: nothing claims a hit any more.
	view.set(match("a", 0, 0, 0), match("b", 0, 0, 0))
	d := route(t, c, Request{TokenIDs: tokens(64)}, snap)
	wantFloat(t, "score after eviction", d.PrefillScore, 1)
}

func other(name string) string {
	if name == "a" {
		return "b"
	}
	return "a"
}

// switchView is a directory answer the test changes between decisions.
type switchView struct{ m *matches }

func (v *switchView) set(ms ...kvdir.Match) { v.m = newMatches(ms...) }
func (v *switchView) Hits(ids []uint32, dst []kvdir.Hit) (*kvdir.Layout, []kvdir.Hit) {
	return v.m.Hits(ids, dst)
}

// An instance that leaves, turns SUSPECT or comes back as another
// incarnation is forgotten: nothing pending or sent is counted for it.
func TestAccountingForgetsInstances(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(snap *instance.Snapshot, i int)
	}{
		{"suspect", func(s *instance.Snapshot, i int) { s.Instances[i].State = instance.Suspect }},
		{"new incarnation", func(s *instance.Snapshot, i int) { s.Instances[i].Registered = time.Unix(1, 0) }},
		{"removed", func(s *instance.Snapshot, i int) {
			s.Instances = append(s.Instances[:i:i], s.Instances[i+1:]...)
		}},
	} {
		clock := newClock()
		view := newMatches(match("a", 0, 0, 0), match("b", 0, 0, 0))
		c := acctCAR(t, 0.5, view, clock, func(o *AccountingOptions) {
			o.Dispatched, o.PendingPrefixes, o.BlockSize = true, true, 16
		})
		snap := snapshot(fleet(clock, "a", "b")...)
		d, i := routeTracked(t, c, snap, tc.name)
		next := snapshot(fleet(clock, "a", "b")...)
		next.Version = snap.Version + 1
		tc.edit(next, i)
		c.acct.sync(next)
		wantPlaces(t, c.acct, next)
		if _, ok := c.acct.insts[d.Prefill]; ok {
			t.Fatalf("%s: %s keeps its accounting", tc.name, d.Prefill)
		}
		if tc.name == "new incarnation" {
			// The new process is routed to as an empty cache with no queue.
			if n := c.acct.at[i].pendingBlocks(chainKeys(tokens(64), 16, nil), c.acct.since(clock.now())); n != 0 {
				t.Fatalf("%d blocks pending on the new incarnation", n)
			}
		}
	}
}

// The same with snapshots whose instances carry MetaGens, as the
// registry's do: a snapshot with the same MetaGens is checked from its
// briefs alone, so an instance turned SUSPECT there is forgotten, one
// whose load changed is kept; a new incarnation or a removal changes the
// MetaGens and is found by name; a Meta changed under the same
// registration (a new MetaGen) keeps the accounting.
func TestAccountingForgetsInstancesByMetaGen(t *testing.T) {
	for _, tc := range []struct {
		name   string
		edit   func(ins []instance.Instance, i int) []instance.Instance
		forgot bool
	}{
		{"suspect", func(ins []instance.Instance, i int) []instance.Instance {
			ins[i].State = instance.Suspect
			return ins
		}, true},
		{"loads changed", func(ins []instance.Instance, i int) []instance.Instance {
			ins[i].Load.WaitingRequests = 7
			return ins
		}, false},
		{"new incarnation", func(ins []instance.Instance, i int) []instance.Instance {
			ins[i].Registered, ins[i].MetaGen = time.Unix(1, 0), 99
			return ins
		}, true},
		{"removed", func(ins []instance.Instance, i int) []instance.Instance {
			return append(ins[:i:i], ins[i+1:]...)
		}, true},
		{"meta refreshed", func(ins []instance.Instance, i int) []instance.Instance {
			ins[i].Meta.DPSize, ins[i].MetaGen = 1, 98
			return ins
		}, false},
	} {
		clock := newClock()
		view := newMatches(match("a", 0, 0, 0), match("b", 0, 0, 0))
		c := acctCAR(t, 0.5, view, clock, func(o *AccountingOptions) { o.Dispatched = true })
		ins := fleet(clock, "a", "b")
		ins[0].MetaGen, ins[1].MetaGen = 1, 2
		snap := snapshot(ins...)
		d, i := routeTracked(t, c, snap, tc.name)
		next := instance.NewSnapshot(tc.edit(slices.Clone(snap.Instances), i), snap.Version+1, true)
		c.acct.sync(next)
		wantPlaces(t, c.acct, next)
		if _, kept := c.acct.insts[d.Prefill]; kept == tc.forgot {
			t.Fatalf("%s: %s kept its accounting: %v", tc.name, d.Prefill, kept)
		}
	}
}

// An instance's accounting follows it to its new place when another
// joins before it, and every state sits at its instance's place after
// each change of the fleet.
func TestAccountingFollowsMovedInstances(t *testing.T) {
	clock := newClock()
	view := newMatches(match("a", 0, 0, 0), match("b", 0, 0, 0))
	c := acctCAR(t, 0.5, view, clock, func(o *AccountingOptions) { o.Dispatched = true })
	snap := snapshot(fleet(clock, "a", "b")...)
	d, _ := routeTracked(t, c, snap, "before the join")
	wantPlaces(t, c.acct, snap)
	for v, names := range [][]string{{"0", "a", "b"}, {"0", "00", "a", "b"}, {"a", "b"}, {"b"}} {
		next := snapshot(fleet(clock, names...)...)
		next.Version = snap.Version + uint64(v) + 1
		c.acct.sync(next)
		wantPlaces(t, c.acct, next)
		i, ok := next.Index(d.Prefill)
		if !ok {
			continue
		}
		if r, _ := c.acct.outstanding(i, c.acct.loadedOf(&next.Instances[i]), c.acct.since(clock.now())); r != 1 {
			t.Fatalf("fleet %v: %s has %v requests outstanding at place %d, want 1", names, d.Prefill, r, i)
		}
	}
}

// Snapshots of other fleets under one version, as a caller building its
// own may hand CAR, are each placed: no decision reads another's places.
func TestAccountingPlacesEverySnapshot(t *testing.T) {
	clock := newClock()
	c := acctCAR(t, 0.5, nil, clock, func(o *AccountingOptions) { o.Dispatched = true })
	for _, names := range [][]string{{"a", "b"}, {"0", "a", "b"}, {"b"}, {"a", "b", "c", "d"}} {
		snap := snapshot(fleet(clock, names...)...) // version 1 each time
		route(t, c, Request{PromptTokens: 10}, snap)
		wantPlaces(t, c.acct, snap)
	}
}

// wantPlaces fails unless the accounting's states by place are those of
// snap's instances by name.
func wantPlaces(t *testing.T, a *accounting, snap *instance.Snapshot) {
	t.Helper()
	if len(a.at) != len(snap.Instances) {
		t.Fatalf("%d places for %d instances", len(a.at), len(snap.Instances))
	}
	for i := range snap.Instances {
		if name := snap.Instances[i].Meta.Name; a.at[i] != a.insts[name] {
			t.Fatalf("place %d (%s) holds %p, the name %p", i, name, a.at[i], a.insts[name])
		}
		if st := a.at[i]; (st == nil && a.sums[i] != acctSum{}) || (st != nil && (a.sums[i] != st.sum() || st.place != i)) {
			t.Fatalf("place %d: the sum %+v does not mirror its state %+v", i, a.sums[i], st)
		}
	}
	if n := len(slices.DeleteFunc(slices.Clone(a.at), func(st *instAcct) bool { return st == nil })); n != len(a.insts) {
		t.Fatalf("%d states placed, %d named", n, len(a.insts))
	}
}

// routeTracked routes a 64-id prompt on snap and returns the decision
// and the chosen instance's place in snap, failing unless CAR keeps
// accounting for it.
func routeTracked(t *testing.T, c *CAR, snap *instance.Snapshot, what string) (Decision, int) {
	t.Helper()
	d := route(t, c, Request{TokenIDs: tokens(64)}, snap)
	if c.acct.insts[d.Prefill] == nil {
		t.Fatalf("%s: no accounting for the chosen instance", what)
	}
	return d, slices.IndexFunc(snap.Instances, func(in instance.Instance) bool { return in.Meta.Name == d.Prefill })
}

// Every structure a client can grow is bounded by its flag.
func TestAccountingBounded(t *testing.T) {
	clock := newClock()
	view := newMatches(match("a", 0, 0, 0))
	snap := snapshot(fleet(clock, "a")...)
	c := acctCAR(t, 0.5, view, clock, func(o *AccountingOptions) {
		o.Dispatched, o.PendingPrefixes, o.BlockSize = true, true, 4
		o.MaxPendingDispatches, o.MaxPendingBlocks = 5, 7
	})
	for i := range 100 {
		ids := tokens(40)
		ids[0] = uint32(1000 + i) // every prompt its own chain
		route(t, c, Request{TokenIDs: ids}, snap)
	}
	st := c.acct.insts["a"]
	if n := len(st.pending); n > 7 {
		t.Fatalf("%d pending blocks, want at most 7", n)
	}
	if r, _ := c.acct.outstanding(0, c.acct.loadedOf(&snap.Instances[0]), c.acct.since(clock.now())); r != 5 {
		t.Fatalf("%v outstanding dispatches, want the cap 5", r)
	}
	if len(st.dispatches.buf) > 5 || len(st.order.buf) > 7 {
		t.Fatalf("rings hold %d and %d entries, want at most 5 and 7", len(st.dispatches.buf), len(st.order.buf))
	}
}

func TestAccountingOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		edit func(*AccountingOptions)
		key  string
	}{
		{func(o *AccountingOptions) { o.TokenWeight = 1.5 }, "--car_dispatch_token_weight"},
		{func(o *AccountingOptions) { o.HeartbeatLag = -time.Millisecond }, "--car_dispatch_heartbeat_lag_ms"},
		{func(o *AccountingOptions) { o.DispatchMaxAge = 0 }, "--car_dispatch_max_age_ms"},
		{func(o *AccountingOptions) { o.PendingTimeout = time.Hour }, "--car_pending_prefix_timeout_ms"},
		{func(o *AccountingOptions) { o.MaxPendingDispatches = 0 }, "--car_max_pending_dispatches"},
		{func(o *AccountingOptions) { o.MaxPendingBlocks = MaxPendingBlocks + 1 }, "--car_max_pending_blocks"},
		{func(o *AccountingOptions) { o.BlockSize = 0 }, "block_size"},
	} {
		o := DefaultAccountingOptions()
		o.Dispatched = true
		tc.edit(&o)
		c, _ := NewCAR(0.5, 0.5)
		err := c.EnableAccounting(o)
		if err == nil || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%s: err = %v, want one naming it", tc.key, err)
		}
	}
	if err := DefaultAccountingOptions().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
}

// Routing with both parts on allocates nothing once warm.
func TestAccountingRouteAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under -race")
	}
	clock := newClock()
	view := newMatches(match("a", 0, 0, 0), match("b", 0, 0, 0))
	snap := snapshot(fleet(clock, "a", "b")...)
	c := acctCAR(t, 0.5, view, clock, func(o *AccountingOptions) {
		o.Dispatched, o.PendingPrefixes, o.BlockSize = true, true, 16
		o.MaxPendingDispatches, o.MaxPendingBlocks = 16, 64
	})
	req := Request{TokenIDs: tokens(256)}
	for range 64 {
		route(t, c, req, snap)
	}
	if n := testing.AllocsPerRun(100, func() { c.Route(req, snap) }); n != 0 {
		t.Fatalf("%v allocations per decision, want 0", n)
	}
}

func TestChainKeysArePrefixKeys(t *testing.T) {
	a := chainKeys(tokens(64), 16, nil)
	b := chainKeys(append(tokens(48), 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 1), 16, nil)
	if len(a) != 4 || len(b) != 4 {
		t.Fatalf("%d and %d keys, want 4 full blocks each", len(a), len(b))
	}
	for i := range 3 {
		if a[i] != b[i] {
			t.Fatalf("block %d of equal prefixes differs", i)
		}
	}
	if a[3] == b[3] {
		t.Fatal("different fourth blocks share a key")
	}
	// A different first block changes every later key.
	other := tokens(64)
	other[0] = 42
	c := chainKeys(other, 16, nil)
	for i := range c {
		if c[i] == a[i] {
			t.Fatalf("key %d equal despite a different first block", i)
		}
	}
}

// A decision reads each candidate's load report time from the
// snapshot's briefs: a report after an instance's dispatches, in the next
// snapshot, supersedes them, and one before them does not.
func TestAccountingReadsReportsFromBriefs(t *testing.T) {
	clock := newClock()
	c := acctCAR(t, 0, nil, clock, func(o *AccountingOptions) { o.Dispatched = true })
	ins := fleet(clock, "a", "b")
	snap := snapshot(ins...)
	first := route(t, c, Request{PromptTokens: 10}, snap)
	clock.advance(time.Millisecond)
	second := route(t, c, Request{PromptTokens: 10}, snap)
	if first.Prefill == second.Prefill {
		t.Fatalf("both requests went to %s", first.Prefill)
	}
	clock.advance(time.Millisecond)
	// The first instance reports after its dispatch, the second before
	// its own.
	for i := range ins {
		if ins[i].Meta.Name == first.Prefill {
			ins[i].LoadUpdated = clock.now()
		}
	}
	next := snapshot(ins...)
	next.Version = snap.Version + 1
	clock.advance(time.Millisecond)
	d := route(t, c, Request{PromptTokens: 10}, next)
	wantRoute(t, d, first.Prefill, "")
	wantFloat(t, "its queue term", d.PrefillScore, 0)
}

// Uncached tokens count until the request is released, whatever the
// load reports say (they carry no tokens); the request count until the
// next report. Release of an unknown or repeated ticket changes nothing.
func TestAccountingReleaseEndsTokens(t *testing.T) {
	clock := newClock()
	a := registeredAt(loaded("a", instance.Default, 0, 0), clock.at(-time.Hour), clock.at(-time.Second))
	b := registeredAt(loaded("b", instance.Default, 0, 0), clock.at(-time.Hour), clock.at(-time.Second))
	c := acctCAR(t, 0, nil, clock, func(o *AccountingOptions) { o.Dispatched, o.TokenWeight = true, 1 })
	snap := snapshot(a, b)
	d1 := route(t, c, Request{PromptTokens: 1000}, snap)
	d2 := route(t, c, Request{PromptTokens: 10}, snap)
	if d1.Ticket == 0 || d2.Ticket <= d1.Ticket || d1.Prefill == d2.Prefill {
		t.Fatalf("decisions %+v, %+v: want increasing tickets on both instances", d1, d2)
	}
	// A report after both supersedes the counts; the tokens stay.
	clock.advance(time.Millisecond)
	a.LoadUpdated, b.LoadUpdated = clock.now(), clock.now()
	snap = snapshot(a, b)
	snap.Version = 2
	clock.advance(time.Millisecond)
	i1, _ := snap.Index(d1.Prefill)
	in1 := &snap.Instances[i1]
	now := c.acct.since(clock.now())
	if r, tok := c.acct.outstanding(i1, c.acct.loadedOf(in1), now); r != 0 || tok != 1000 {
		t.Fatalf("after the report: %v requests, %v tokens; want 0, 1000", r, tok)
	}
	d3 := route(t, c, Request{PromptTokens: 10}, snap)
	wantRoute(t, d3, d2.Prefill, "")
	c.Release(d1)
	c.Release(d1)
	c.Release(Decision{Prefill: d1.Prefill, Ticket: 999})
	c.Release(Decision{Prefill: "gone", Ticket: d1.Ticket})
	if r, tok := c.acct.outstanding(i1, c.acct.loadedOf(in1), c.acct.since(clock.now())); r != 0 || tok != 0 {
		t.Fatalf("after release: %v requests, %v tokens; want 0, 0", r, tok)
	}
	i2, _ := snap.Index(d2.Prefill)
	if _, tok := c.acct.outstanding(i2, c.acct.loadedOf(&snap.Instances[i2]), c.acct.since(clock.now())); tok != 20 {
		t.Fatalf("the other instance: %v tokens, want 20", tok)
	}
	// Released tokens no longer weigh: the 1000-token instance wins now.
	wantRoute(t, route(t, c, Request{PromptTokens: 10}, snap), d1.Prefill, "")
	// A CAR without accounting hands out no tickets.
	if d := route(t, mustCAR(t, 0.5, 0.5, nil), Request{}, snap); d.Ticket != 0 {
		t.Fatalf("ticket %d without accounting", d.Ticket)
	}
}
