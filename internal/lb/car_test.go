package lb

import (
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvcar/kvcar/internal/instance"
	"github.com/kvcar/kvcar/internal/kvdir"
)

const (
	P = instance.Prefill
	D = instance.Decode
	F = instance.Default
)

// R-CAR-1: both flags are validated in [0,1] and the error names the flag.
func TestNewCARValidatesFlags(t *testing.T) {
	for _, bad := range []float64{-0.01, 1.01, math.NaN(), math.Inf(1)} {
		if _, err := NewCAR(bad, 0.5); err == nil || !strings.Contains(err.Error(), "--car_prefill_lambda") || !strings.Contains(err.Error(), "[0, 1]") {
			t.Errorf("NewCAR(%v, 0.5) err = %v, want one naming --car_prefill_lambda and [0, 1]", bad, err)
		}
		if _, err := NewCAR(0.5, bad); err == nil || !strings.Contains(err.Error(), "--car_host_hit_weight") || !strings.Contains(err.Error(), "[0, 1]") {
			t.Errorf("NewCAR(0.5, %v) err = %v, want one naming --car_host_hit_weight and [0, 1]", bad, err)
		}
	}
	for _, ok := range [][2]float64{{0, 0}, {1, 1}, {0.5, 0.5}} {
		c, err := NewCAR(ok[0], ok[1])
		if err != nil {
			t.Fatalf("NewCAR(%v, %v): %v", ok[0], ok[1], err)
		}
		if c.Lambda() != ok[0] || c.HostHitWeight() != ok[1] {
			t.Fatalf("NewCAR(%v, %v) kept (%v, %v)", ok[0], ok[1], c.Lambda(), c.HostHitWeight())
		}
	}
}

// R-CAR-3: λ = 0 compares queues only; the full hit of a does not help.
func TestCARLambdaZeroComparesQueuesOnly(t *testing.T) {
	snap := snapshot(loaded("a", F, 4, 0), loaded("b", F, 2, 0))
	view := newMatches(match("a", 0, 1000, 0))
	d := route(t, mustCAR(t, 0, 0.5, view), Request{TokenIDs: tokens(1000)}, snap)
	// a: queue 4/4 = 1; b: queue 2/4 = 0.5.
	wantRoute(t, d, "b", "")
	wantFloat(t, "PrefillScore", d.PrefillScore, 0.5)
	wantFloat(t, "HitRatio", d.HitRatio, 0)
}

// R-CAR-3: λ = 1 compares cache misses only; a long queue does not hurt.
func TestCARLambdaOneComparesCacheMissOnly(t *testing.T) {
	snap := snapshot(loaded("a", F, 10, 0), loaded("b", F, 0, 0))
	view := newMatches(match("a", 0, 768, 0), match("b", 0, 256, 0))
	d := route(t, mustCAR(t, 1, 0.5, view), Request{TokenIDs: tokens(1024)}, snap)
	// a: miss 1 − 0.75 = 0.25; b: miss 1 − 0.25 = 0.75.
	wantRoute(t, d, "a", "")
	wantFloat(t, "HitRatio", d.HitRatio, 0.75)
	wantFloat(t, "PrefillScore", d.PrefillScore, 0.25)
}

// R-CAR-3: λ = 0.5, w = 0.5, 1000 input tokens, max waiting 8:
//
//	a: hit (600 + 0.5·200)/1000 = 0.7, queue 8/8 = 1    → 0.5·0.3 + 0.5·1    = 0.65
//	b: hit (200 + 0.5·0)/1000   = 0.2, queue 2/8 = 0.25 → 0.5·0.8 + 0.5·0.25 = 0.525
//	c: hit 0 (no stream),              queue 4/8 = 0.5  → 0.5·1   + 0.5·0.5  = 0.75
//
// b wins with 0.525.
func TestCARMixedExample(t *testing.T) {
	snap := snapshot(loaded("a", F, 8, 0.9), loaded("b", F, 2, 0.1), loaded("c", F, 4, 0))
	view := newMatches(match("a", 0, 600, 200), match("b", 0, 200, 0))
	d := route(t, mustCAR(t, 0.5, 0.5, view), Request{TokenIDs: tokens(1000)}, snap)
	wantRoute(t, d, "b", "")
	wantFloat(t, "HitRatio", d.HitRatio, 0.2)
	wantFloat(t, "PrefillScore", d.PrefillScore, 0.525)
	if d.Reason != reasonCARAlone {
		t.Fatalf("Reason = %q", d.Reason)
	}
}

// R-CAR-3: w weighs Host-only hit tokens against Device ones. a holds
// 800 of 1000 tokens on Host only, b 500 on Device; equal queues, λ=1.
func TestCARHostHitWeight(t *testing.T) {
	snap := snapshot(loaded("a", F, 1, 0), loaded("b", F, 1, 0))
	view := newMatches(match("a", 0, 0, 800), match("b", 0, 500, 0))
	for _, tc := range []struct {
		w       float64
		winner  string
		wantHit float64
	}{
		{w: 1, winner: "a", wantHit: 0.8},   // a 0.8 > b 0.5
		{w: 0.5, winner: "b", wantHit: 0.5}, // a 0.4 < b 0.5
		{w: 0, winner: "b", wantHit: 0.5},   // a 0
	} {
		d := route(t, mustCAR(t, 1, tc.w, view), Request{TokenIDs: tokens(1000)}, snap)
		wantRoute(t, d, tc.winner, "")
		wantFloat(t, "HitRatio", d.HitRatio, tc.wantHit)
	}
}

// R-CAR-3: the hit ratio is clamped to [0,1] even for counts a correct
// directory cannot report.
func TestCARHitClamped(t *testing.T) {
	snap := snapshot(loaded("a", F, 0, 0))
	for _, tc := range []struct {
		m    kvdir.Match
		want float64
	}{
		{match("a", 0, 1000, 1000), 1}, // (1000 + 1·1000)/1000 = 2
		{match("a", 0, -50, 0), 0},     // negative
	} {
		d := route(t, mustCAR(t, 1, 1, newMatches(tc.m)), Request{TokenIDs: tokens(1000)}, snap)
		wantFloat(t, "HitRatio", d.HitRatio, tc.want)
		wantFloat(t, "PrefillScore", d.PrefillScore, 1-tc.want)
	}
}

// R-CAR-3: when every queue is empty the queue term is 0, not NaN.
func TestCARAllQueuesEmpty(t *testing.T) {
	snap := snapshot(loaded("a", F, 0, 0), loaded("b", F, 0, 0))
	view := newMatches(match("a", 0, 100, 0), match("b", 0, 300, 0))
	d := route(t, mustCAR(t, 0.5, 0.5, view), Request{TokenIDs: tokens(1000)}, snap)
	// a: 0.5·0.9 = 0.45; b: 0.5·0.7 = 0.35.
	wantRoute(t, d, "b", "")
	wantFloat(t, "PrefillScore", d.PrefillScore, 0.35)
}

// R-CAR-6: a multi-DP instance's hit ratio is the minimum over its DPs.
func TestCARMultiDPMinimum(t *testing.T) {
	snap := snapshot(withDP(loaded("a", F, 0, 0), 2))
	view := newMatches(match("a", 0, 800, 0), match("a", 1, 400, 0))
	d := route(t, mustCAR(t, 1, 0.5, view), Request{TokenIDs: tokens(1000)}, snap)
	wantFloat(t, "HitRatio", d.HitRatio, 0.4) // min(0.8, 0.4)
}

// R-CAR-6: streams of ranks beyond dp_size (an older DP topology) do
// not count.
func TestCARIgnoresRanksBeyondDPSize(t *testing.T) {
	snap := snapshot(withDP(loaded("a", F, 0, 0), 2))
	view := newMatches(match("a", 0, 800, 0), match("a", 1, 600, 0), match("a", 2, 0, 0))
	d := route(t, mustCAR(t, 1, 0.5, view), Request{TokenIDs: tokens(1000)}, snap)
	wantFloat(t, "HitRatio", d.HitRatio, 0.6)
}

// R-CAR-6: a missing or unsynchronised DP makes the instance's hit 0,
// and the instance can still win on queue cost.
func TestCARMissingOrUnsyncedDPGivesZero(t *testing.T) {
	unsynced := match("a", 1, 900, 0)
	unsynced.Synchronized = false
	for name, view := range map[string]*matches{
		"missing":      newMatches(match("a", 0, 900, 0), match("b", 0, 300, 0)),
		"unsynced":     newMatches(match("a", 0, 900, 0), unsynced, match("b", 0, 300, 0)),
		"missing rank": newMatches(match("a", 1, 900, 0), match("b", 0, 300, 0)),
	} {
		t.Run(name, func(t *testing.T) {
			snap := snapshot(withDP(loaded("a", F, 0, 0), 2), loaded("b", F, 10, 0))
			d := route(t, mustCAR(t, 1, 0.5, view), Request{TokenIDs: tokens(1000)}, snap)
			// λ=1: a 1 − 0 = 1, b 1 − 0.3 = 0.7 → b.
			wantRoute(t, d, "b", "")
			// λ=0.5: a 0.5·1 + 0.5·0 = 0.5, b 0.5·0.7 + 0.5·1 = 0.85 → a, on queue.
			d = route(t, mustCAR(t, 0.5, 0.5, view), Request{TokenIDs: tokens(1000)}, snap)
			wantRoute(t, d, "a", "")
			wantFloat(t, "HitRatio", d.HitRatio, 0)
			wantFloat(t, "PrefillScore", d.PrefillScore, 0.5)
		})
	}
}

// R-CAR-7, R-DISC-5: hits count only for the instance's current
// incarnation: incarnation_id, else register_ts_ms. Identities that
// differ, one side empty included, never count; with none on either
// side, a discovered stream counts (issue 10 item 12) and a static one
// does not.
func TestCARIncarnation(t *testing.T) {
	byID := loaded("a", F, 0, 0)
	legacy := loaded("a", F, 0, 0)
	legacy.Meta.IncarnationID, legacy.Meta.RegisterTsMs = "", 1700000000123
	anonymous := loaded("a", F, 0, 0)
	anonymous.Meta.IncarnationID = ""
	withInc := func(inc string) kvdir.Match {
		m := match("a", 0, 500, 0)
		m.Incarnation = inc
		return m
	}
	discovered := func(inc string) kvdir.Match {
		m := withInc(inc)
		m.Discovered = true
		return m
	}
	for _, tc := range []struct {
		name string
		in   instance.Instance
		m    kvdir.Match
		want float64
	}{
		{"current id", byID, withInc("inc-a"), 0.5},
		{"stale id", byID, withInc("inc-a-old"), 0},
		{"static stream", byID, withInc(""), 0},
		{"register time", legacy, withInc("1700000000123"), 0.5},
		{"other register time", legacy, withInc("1700000000124"), 0},
		{"no identity, static stream", anonymous, withInc(""), 0},
		{"no identity, static stream has one", anonymous, withInc("x"), 0},
		{"no identity, discovered stream", anonymous, discovered(""), 0.5},
		{"no identity, discovered stream has one", anonymous, discovered("x"), 0},
		{"current id, discovered", byID, discovered("inc-a"), 0.5},
		{"id, discovered stream has none", byID, discovered(""), 0},
		{"stale id, discovered", byID, discovered("inc-a-old"), 0},
		{"register time, discovered stream has none", legacy, discovered(""), 0},
		{"register time, discovered", legacy, discovered("1700000000123"), 0.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := route(t, mustCAR(t, 1, 0.5, newMatches(tc.m)), Request{TokenIDs: tokens(1000)}, snapshot(tc.in))
			wantFloat(t, "HitRatio", d.HitRatio, tc.want)
		})
	}
}

// R-CAR-6, R-CAR-7: CAR keeps which streams decide each instance's ratio
// between decisions (the join). One CAR over one directory layout routes
// a sequence of snapshots, copies as the registry makes them and edits
// of identity, DP size and membership, each as a new CAR with nothing
// kept would: a kept join is used only for the instances' same
// identities, and a change to any makes a new one.
func TestCARJoinFollowsTheFleet(t *testing.T) {
	view := newMatches(match("a", 0, 500, 0), match("a", 1, 300, 0), match("b", 0, 700, 0))
	a := withDP(loaded("a", F, 0, 0), 2)
	b := loaded("b", F, 9, 0)
	base := snapshot(a, b)
	// copyOf is the next snapshot of an unchanged fleet: new structures,
	// the same strings, as the registry publishes after a load report.
	copyOf := func(s *instance.Snapshot, edit func(in []instance.Instance)) *instance.Snapshot {
		next := &instance.Snapshot{Instances: slices.Clone(s.Instances), Version: s.Version + 1, Synced: true}
		if edit != nil {
			edit(next.Instances)
		}
		return next
	}
	routeSteps(t, view, []joinStep{
		{"first", base, 0.3},
		{"same snapshot", base, 0.3},
		{"next snapshot, loads changed", copyOf(base, func(in []instance.Instance) { in[1].Load.WaitingRequests = 0 }), 0.3},
		{"a new incarnation", copyOf(base, func(in []instance.Instance) { in[0].Meta.IncarnationID = "inc-a-2" }), 0},
		{"the old one back, equal strings elsewhere", copyOf(base, func(in []instance.Instance) {
			in[0].Meta.Name, in[0].Meta.IncarnationID = strings.Clone("a"), strings.Clone("inc-a")
		}), 0.3},
		{"one DP rank", copyOf(base, func(in []instance.Instance) { in[0].Meta.DPSize = 1 }), 0.5},
		{"three DP ranks, one without a stream", copyOf(base, func(in []instance.Instance) { in[0].Meta.DPSize = 3 }), 0},
		{"register time instead of an id", copyOf(base, func(in []instance.Instance) {
			in[0].Meta.IncarnationID, in[0].Meta.RegisterTsMs = "", 5
		}), 0},
		{"an instance before a", snapshot(loaded("0", F, 9, 0), a, b), 0.3},
		{"b gone", snapshot(a), 0.3},
		{"back to the first", base, 0.3},
	})
}

// joinStep is a snapshot a kept join meets, and a's hit ratio there; b's
// is 0.7 while it is there.
type joinStep struct {
	name  string
	snap  *instance.Snapshot
	wantA float64
}

// routeSteps routes each step's snapshot in turn with one CAR over view,
// and checks that each decision is what a CAR with nothing kept decides,
// with a's hit ratio as the step wants; it returns the CAR.
func routeSteps(t *testing.T, view PrefixView, steps []joinStep) *CAR {
	t.Helper()
	kept := mustCAR(t, 1, 0.5, view)
	for _, st := range steps {
		d := route(t, kept, Request{TokenIDs: tokens(1000)}, st.snap)
		fresh := route(t, mustCAR(t, 1, 0.5, view), Request{TokenIDs: tokens(1000)}, st.snap)
		if d != fresh {
			t.Fatalf("%s: decision %+v with the kept join, %+v with a new one", st.name, d, fresh)
		}
		want := max(st.wantA, 0.7)
		if len(st.snap.Instances) == 1 {
			want = st.wantA
		}
		wantFloat(t, st.name+": HitRatio", d.HitRatio, want)
		if want == st.wantA && d.Prefill != "a" {
			t.Fatalf("%s: routed to %s, want a", st.name, d.Prefill)
		}
	}
	return kept
}

// The join as the registry's snapshots let CAR keep it: each Meta named
// by a MetaGen, a new one with every registration or change of one. The
// same fleet as above, each step's changed instances given new MetaGens
// (as the registry gives them) and the others their old ones, routes as
// a CAR with nothing kept would.
func TestCARJoinFollowsTheFleetByMetaGen(t *testing.T) {
	view := newMatches(match("a", 0, 500, 0), match("a", 1, 300, 0), match("b", 0, 700, 0))
	gen := uint64(100)
	named := func(in instance.Instance) instance.Instance {
		gen++
		in.MetaGen = gen
		return in
	}
	a, b := named(withDP(loaded("a", F, 0, 0), 2)), named(loaded("b", F, 9, 0))
	base := snapshot(a, b)
	// next is the registry's next snapshot: edit changes the instances,
	// and those whose Meta it changed (renamed) get new MetaGens.
	next := func(s *instance.Snapshot, edit func(in []instance.Instance), renamed ...int) *instance.Snapshot {
		ins := slices.Clone(s.Instances)
		edit(ins)
		for _, i := range renamed {
			ins[i] = named(ins[i])
		}
		return instance.NewSnapshot(ins, s.Version+1, true)
	}
	loads := next(base, func(in []instance.Instance) { in[1].Load.WaitingRequests = 0 })
	newInc := next(loads, func(in []instance.Instance) { in[0].Meta.IncarnationID = "inc-a-2" }, 0)
	oldInc := next(newInc, func(in []instance.Instance) { in[0].Meta.IncarnationID = "inc-a" }, 0)
	kept := routeSteps(t, view, []joinStep{
		{"first", base, 0.3},
		{"next snapshot, loads changed", loads, 0.3},
		{"a new incarnation", newInc, 0},
		{"its loads changed", next(newInc, func(in []instance.Instance) { in[1].Load.WaitingRequests = 4 }), 0},
		{"the old one back", oldInc, 0.3},
		{"one DP rank", next(oldInc, func(in []instance.Instance) { in[0].Meta.DPSize = 1 }, 0), 0.5},
		{"an instance before a", snapshot(named(loaded("0", F, 9, 0)), a, b), 0.3},
		{"b gone", snapshot(a), 0.3},
		{"back to the first", base, 0.3},
	})

	// The MetaGens alone decide: a snapshot that keeps every MetaGen keeps
	// the join without reading the instances, so a Meta changed without a
	// new MetaGen, which the registry never publishes, goes unseen.
	// With a alone, its ratio is the decision's.
	alone := snapshot(a)
	unseen := next(alone, func(in []instance.Instance) { in[0].Meta.IncarnationID = "inc-a-3" })
	wantFloat(t, "a alone: HitRatio", route(t, kept, Request{TokenIDs: tokens(1000)}, alone).HitRatio, 0.3)
	wantFloat(t, "a Meta changed under its MetaGen: HitRatio", route(t, kept, Request{TokenIDs: tokens(1000)}, unseen).HitRatio, 0.3)
	wantFloat(t, "the same, with nothing kept: HitRatio", route(t, mustCAR(t, 1, 0.5, view), Request{TokenIDs: tokens(1000)}, unseen).HitRatio, 0)
	// A new MetaGen for the same Meta is checked and kept.
	wantFloat(t, "a new MetaGen, the same Meta: HitRatio",
		route(t, kept, Request{TokenIDs: tokens(1000)}, next(alone, func([]instance.Instance) {}, 0)).HitRatio, 0.3)
}

// R-CAR-7: the allocation-free identity check agrees with
// Instance.Incarnation.
func TestSameIncarnationAgreesWithInstance(t *testing.T) {
	for _, m := range []instance.Meta{
		{IncarnationID: "p-1"},
		{IncarnationID: "p-1", RegisterTsMs: 5},
		{RegisterTsMs: 1700000000123},
		{RegisterTsMs: -9223372036854775808},
		{},
	} {
		in := instance.Instance{Meta: m}
		for _, inc := range []string{in.Incarnation(), "p-1", "5", "1700000000123", "-9223372036854775808", ""} {
			for _, disc := range []bool{false, true} {
				want := inc == in.Incarnation() && (inc != "" || disc)
				if got := sameIncarnation(&in, inc, disc); got != want {
					t.Errorf("sameIncarnation(%+v, %q, discovered %v) = %v, want %v", m, inc, disc, got, want)
				}
			}
		}
	}
}

// R-CAR-5: equal scores take turns, so no instance is permanently
// preferred.
func TestCARTiesRotate(t *testing.T) {
	snap := snapshot(loaded("a", F, 3, 0), loaded("b", F, 3, 0), loaded("c", F, 3, 0), loaded("z", F, 6, 0))
	c := mustCAR(t, 0.5, 0.5, nil)
	var got []string
	for range 6 {
		d := route(t, c, Request{TokenIDs: tokens(10)}, snap)
		got = append(got, d.Prefill)
		if d.Reason != reasonCARAloneTied {
			t.Fatalf("Reason = %q", d.Reason)
		}
	}
	if strings.Join(got, ",") != "a,b,c,a,b,c" {
		t.Fatalf("tied winners %v, want a,b,c,a,b,c", got)
	}
}

// R-CAR-5: scores equal up to float rounding are tied too. With max
// waiting 10 and λ = 0.5:
//
//	a: 0.5·(1 − 0.1) + 0.5·3/10 = 0.6               in float64: 0.6
//	b: 0.5·(1 − 0.2) + 0.5·4/10 = 0.6               in float64: 0.6000000000000001
//	c: 0.5·(1 − 0)   + 0.5·10/10 = 1
func TestCARNearTiesRotate(t *testing.T) {
	snap := snapshot(loaded("a", F, 3, 0), loaded("b", F, 4, 0), loaded("c", F, 10, 0))
	view := newMatches(match("a", 0, 100, 0), match("b", 0, 200, 0))
	c := mustCAR(t, 0.5, 0.5, view)
	var got []string
	for range 4 {
		got = append(got, route(t, c, Request{TokenIDs: tokens(1000)}, snap).Prefill)
	}
	if strings.Join(got, ",") != "a,b,a,b" {
		t.Fatalf("winners %v, want a,b,a,b", got)
	}
}

// R-CAR-5: concurrent ties share the load exactly: every call takes one
// turn of the policy's counter.
func TestCARTiesShareConcurrently(t *testing.T) {
	snap := snapshot(loaded("a", F, 0, 0), loaded("b", F, 0, 0), loaded("c", F, 0, 0), loaded("d", F, 0, 0))
	c := mustCAR(t, 0.5, 0.5, nil)
	const goroutines, calls = 8, 200
	var mu sync.Mutex
	counts := map[string]int{}
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			local := map[string]int{}
			for range calls {
				d, err := c.Route(Request{}, snap)
				if err != nil {
					t.Error(err)
					return
				}
				local[d.Prefill]++
			}
			mu.Lock()
			for k, v := range local {
				counts[k] += v
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	for _, name := range []string{"a", "b", "c", "d"} {
		if counts[name] != goroutines*calls/4 {
			t.Fatalf("counts %v, want %d each", counts, goroutines*calls/4)
		}
	}
}

// R-CAR-2: SUSPECT instances and instances without a valid load report
// are not candidates, whatever their hits, and their queues do not scale
// the others'. LEASE_LOST instances remain candidates.
func TestCARExcludedCandidates(t *testing.T) {
	noLoad := loaded("n", F, 0, 0)
	noLoad.HasLoad, noLoad.LoadValid, noLoad.Load = false, false, instance.Load{}
	invalid := loaded("i", F, 100, 0) // Load holds the last valid report
	invalid.LoadValid = false
	suspect := withState(loaded("s", F, 0, 0), instance.Suspect)
	leaseLost := withState(loaded("l", F, 4, 0), instance.LeaseLost)
	snap := snapshot(noLoad, invalid, suspect, leaseLost, loaded("a", F, 2, 0))
	view := newMatches(match("i", 0, 1000, 0), match("n", 0, 1000, 0), match("s", 0, 1000, 0))

	d := route(t, mustCAR(t, 0.5, 0.5, view), Request{TokenIDs: tokens(1000)}, snap)
	// Candidates a (queue 2/4) and l (4/4), no hits: a 0.5 + 0.25 = 0.75.
	wantRoute(t, d, "a", "")
	wantFloat(t, "PrefillScore", d.PrefillScore, 0.75)

	d = route(t, mustCAR(t, 0.5, 0.5, view), Request{TokenIDs: tokens(1000)}, snapshot(noLoad, invalid, suspect, leaseLost))
	wantRoute(t, d, "l", "")

	_, err := mustCAR(t, 0.5, 0.5, view).Route(Request{TokenIDs: tokens(1000)}, snapshot(noLoad, invalid, suspect))
	wantNoCandidate(t, err, "no schedulable PREFILL or DEFAULT instance with a load report",
		"1 SUSPECT", "1 without a first load report", "1 with an invalid load report")
	_, err = mustCAR(t, 0.5, 0.5, view).Route(Request{}, snapshot())
	wantNoCandidate(t, err, "none registered")
	_, err = mustCAR(t, 0.5, 0.5, view).Route(Request{}, nil)
	wantNoCandidate(t, err)
}

// R-CAR-2: excluded decode instances are not chosen either.
func TestCARExcludedDecode(t *testing.T) {
	noLoad := loaded("d0", D, 0, 0)
	noLoad.HasLoad = false
	snap := snapshot(loaded("p", P, 0, 0), noLoad, withState(loaded("d1", D, 0, 0), instance.Suspect), loaded("d2", D, 9, 0.9))
	d := route(t, mustCAR(t, 0.5, 0.5, nil), Request{}, snap)
	wantRoute(t, d, "p", "d2")
}

// R-CAR-2: only DEFAULT may serve without a decode instance: a PREFILL
// with the best hit is passed over when there is no decode candidate.
func TestCARPrefillWithoutDecodeNotChosen(t *testing.T) {
	view := newMatches(match("p", 0, 1000, 0))
	suspectD := withState(loaded("d", D, 0, 0), instance.Suspect)
	d := route(t, mustCAR(t, 0.5, 0.5, view), Request{TokenIDs: tokens(1000)}, snapshot(loaded("p", P, 0, 0), loaded("f", F, 5, 0), suspectD))
	wantRoute(t, d, "f", "")
	// Normalised over the instances that can be chosen: f alone, 5/5.
	wantFloat(t, "PrefillScore", d.PrefillScore, 1)

	_, err := mustCAR(t, 0.5, 0.5, view).Route(Request{TokenIDs: tokens(1000)}, snapshot(loaded("p", P, 0, 0), suspectD))
	wantNoCandidate(t, err, "1 PREFILL that need a decode instance", "only DEFAULT may serve alone", "decode instances excluded: 1 SUSPECT")
}

// R-CAR-2: DEFAULT and PREFILL compete on one score; a DEFAULT winner
// serves alone even when decode instances exist, a PREFILL winner gets
// one.
func TestCARDefaultAndPrefillCompete(t *testing.T) {
	snap := snapshot(loaded("f", F, 0, 0), loaded("p", P, 0, 0), loaded("d", D, 0, 0))
	d := route(t, mustCAR(t, 1, 0.5, newMatches(match("f", 0, 900, 0), match("p", 0, 100, 0))), Request{TokenIDs: tokens(1000)}, snap)
	wantRoute(t, d, "f", "")
	d = route(t, mustCAR(t, 1, 0.5, newMatches(match("f", 0, 100, 0), match("p", 0, 900, 0))), Request{TokenIDs: tokens(1000)}, snap)
	wantRoute(t, d, "p", "d")
	if d.Reason != reasonCARLowest {
		t.Fatalf("Reason = %q", d.Reason)
	}
}

// R-CAR-2: a MIX instance joins the side of its current role.
func TestCARMixByRole(t *testing.T) {
	snap := snapshot(mix("m-d", D, 0, 0), mix("m-p", P, 0, 0))
	d := route(t, mustCAR(t, 0.5, 0.5, nil), Request{}, snap)
	wantRoute(t, d, "m-p", "m-d")

	// MIX-as-PREFILL needs a decode instance like a PREFILL.
	_, err := mustCAR(t, 0.5, 0.5, nil).Route(Request{}, snapshot(mix("m-p", P, 0, 0)))
	wantNoCandidate(t, err, "PREFILL that need a decode instance")
	// MIX-as-DECODE never prefills.
	_, err = mustCAR(t, 0.5, 0.5, nil).Route(Request{}, snapshot(mix("m-d", D, 0, 0)))
	wantNoCandidate(t, err)
	// A MIX instance without a PREFILL or DECODE role serves nowhere.
	_, err = mustCAR(t, 0.5, 0.5, nil).Route(Request{}, snapshot(mix("m-?", F, 0, 0)))
	wantNoCandidate(t, err, "none registered")
}

// R-CAR-4: D cost is gpu_cache_usage_perc + waiting/max(waiting); the
// directory's view of decode instances plays no part. With max waiting 8:
//
//	d1: 0.30 + 4/8 = 0.80
//	d2: 0.60 + 0/8 = 0.60
//	d3: 0.10 + 8/8 = 1.10
func TestCARDecodeScore(t *testing.T) {
	snap := snapshot(loaded("p", P, 0, 0), loaded("d1", D, 4, 0.3), loaded("d2", D, 0, 0.6), loaded("d3", D, 8, 0.1))
	view := newMatches(match("d1", 0, 1000, 0), match("d3", 0, 1000, 0))
	d := route(t, mustCAR(t, 0.5, 0.5, view), Request{TokenIDs: tokens(1000)}, snap)
	wantRoute(t, d, "p", "d2")
	wantFloat(t, "DecodeScore", d.DecodeScore, 0.6)

	// All queues empty: usage alone.
	snap = snapshot(loaded("p", P, 0, 0), loaded("d1", D, 0, 0.3), loaded("d2", D, 0, 0.2))
	d = route(t, mustCAR(t, 0.5, 0.5, nil), Request{}, snap)
	wantRoute(t, d, "p", "d2")
	wantFloat(t, "DecodeScore", d.DecodeScore, 0.2)
}

// R-CAR-5: decode ties rotate on their own turn.
func TestCARDecodeTiesRotate(t *testing.T) {
	snap := snapshot(loaded("p", P, 0, 0), loaded("d1", D, 1, 0.5), loaded("d2", D, 1, 0.5))
	c := mustCAR(t, 0.5, 0.5, nil)
	var got []string
	for range 4 {
		d := route(t, c, Request{}, snap)
		got = append(got, d.Decode)
		if d.Reason != reasonCARDecodeTied {
			t.Fatalf("Reason = %q", d.Reason)
		}
	}
	if strings.Join(got, ",") != "d1,d2,d1,d2" {
		t.Fatalf("decode winners %v", got)
	}
}

// A PREFILL hands its KV to a decode instance of its own backend_type;
// other backends are routed like xllm.
func TestCARBackendPairing(t *testing.T) {
	snap := snapshot(
		withBackend(loaded("pv", P, 0, 0), "vllm"),
		loaded("px", P, 5, 0),
		loaded("dx", D, 0, 0),
		withBackend(loaded("dv", D, 9, 0), "vllm"),
		withBackend(loaded("dv2", D, 0, 0.5), "vllm"),
	)
	d := route(t, mustCAR(t, 0, 0.5, nil), Request{}, snap)
	wantRoute(t, d, "pv", "dv2") // dv: 0 + 9/9; dv2: 0.5 + 0/9
	d = route(t, mustCAR(t, 0, 0.5, nil), Request{}, snapshot(withBackend(loaded("pv", P, 0, 0), "vllm"), loaded("dx", D, 0, 0), loaded("fx", F, 3, 0)))
	wantRoute(t, d, "fx", "")
	d = route(t, mustCAR(t, 0, 0.5, nil), Request{}, snapshot(withBackend(loaded("fv", F, 0, 0), "vllm")))
	wantRoute(t, d, "fv", "")
	// An empty backend_type is the registry's default, xllm.
	d = route(t, mustCAR(t, 0, 0.5, nil), Request{}, snapshot(withBackend(loaded("p", P, 0, 0), ""), loaded("dx", D, 0, 0)))
	wantRoute(t, d, "p", "dx")
}

// R-CFG-1, R-CAR-8: without a view every hit is 0 and routing goes on;
// a nil *kvdir.Directory counts as no view.
func TestCARNilView(t *testing.T) {
	snap := snapshot(loaded("a", F, 2, 0), loaded("b", F, 1, 0))
	for name, v := range map[string]PrefixView{"nil": nil, "nil directory": (*kvdir.Directory)(nil)} {
		t.Run(name, func(t *testing.T) {
			d := route(t, mustCAR(t, 0.5, 0.5, v), Request{TokenIDs: tokens(100)}, snap)
			wantRoute(t, d, "b", "")
			wantFloat(t, "PrefillScore", d.PrefillScore, 0.5+0.25)
		})
	}
}

// R-CAR-8, R-DIR-4: the directory is queried once per request, with the
// request's tokens, and not at all when the answer could not matter.
func TestCARQueriesOnce(t *testing.T) {
	view := newMatches(match("a", 0, 10, 0))
	c := mustCAR(t, 0.5, 0.5, view)
	snap := snapshot(loaded("a", F, 0, 0), loaded("b", F, 0, 0))
	route(t, c, Request{TokenIDs: tokens(77)}, snap)
	if n, l := view.queries.Load(), view.lastLen.Load(); n != 1 || l != 77 {
		t.Fatalf("%d queries, last with %d tokens; want 1 with 77", n, l)
	}
	d := route(t, c, Request{PromptTokens: 50}, snap) // no ids: hit 0
	wantFloat(t, "HitRatio", d.HitRatio, 0)
	c.Route(Request{TokenIDs: tokens(5)}, snapshot())
	if n := view.queries.Load(); n != 1 {
		t.Fatalf("%d queries, want 1", n)
	}
	c.SetPrefixView(nil)
	route(t, c, Request{TokenIDs: tokens(5)}, snap)
	if n := view.queries.Load(); n != 1 {
		t.Fatalf("%d queries after the view was removed, want 1", n)
	}
}

// R-CAR-8: unsynchronised streams, whatever their counts, only lose the
// cache term.
func TestCARDirectoryFaultOnlyZeroesCacheTerm(t *testing.T) {
	faulty := match("a", 0, 1000, 0)
	faulty.Synchronized, faulty.Error = false, "sequence gap"
	snap := snapshot(loaded("a", F, 0, 0), loaded("b", F, 4, 0))
	d := route(t, mustCAR(t, 0.5, 0.5, newMatches(faulty)), Request{TokenIDs: tokens(1000)}, snap)
	wantRoute(t, d, "a", "")
	wantFloat(t, "HitRatio", d.HitRatio, 0)
}
