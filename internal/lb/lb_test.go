package lb

import (
	"strings"
	"sync"
	"testing"

	"github.com/kvcar/kvcar/internal/instance"
)

// R-CAR-1, R-CAR-9: --load_balance_policy names the policy, exactly.
func TestNew(t *testing.T) {
	view := newMatches(match("a", 0, 100, 0))
	for _, name := range []string{PolicyRR, PolicyCAR, PolicySLOAware} {
		opts := DefaultOptions()
		opts.Prefix = view
		p, err := New(name, opts)
		if err != nil {
			t.Fatalf("New(%q): %v", name, err)
		}
		if p.Name() != name {
			t.Fatalf("New(%q).Name() = %q", name, p.Name())
		}
	}
	for _, bad := range []string{"car", "rr", "Slo_Aware", "", "CACHE_AWARE"} {
		_, err := New(bad, DefaultOptions())
		if err == nil || !strings.Contains(err.Error(), "RR, CAR, SLO_AWARE") {
			t.Fatalf("New(%q) err = %v, want one listing RR, CAR, SLO_AWARE", bad, err)
		}
	}
}

func TestNewValidatesOnlyTheChosenPolicy(t *testing.T) {
	opts := DefaultOptions()
	opts.CARPrefillLambda = 2
	if _, err := New(PolicyCAR, opts); err == nil || !strings.Contains(err.Error(), "--car_prefill_lambda") {
		t.Fatalf("err = %v", err)
	}
	if _, err := New(PolicyRR, opts); err != nil {
		t.Fatal(err)
	}
	opts = DefaultOptions()
	opts.TargetTPOTms = -5
	if _, err := New(PolicySLOAware, opts); err == nil || !strings.Contains(err.Error(), "--target_tpot") {
		t.Fatalf("err = %v", err)
	}
}

// R-CAR-1: the defaults are those of xllm_master_serving.
func TestDefaultOptions(t *testing.T) {
	o := DefaultOptions()
	if o.CARPrefillLambda != 0.5 || o.CARHostHitWeight != 0.5 || o.TargetTTFTms != 1000 || o.TargetTPOTms != 50 || o.Prefix != nil {
		t.Fatalf("DefaultOptions() = %+v", o)
	}
}

// New passes the prefix view to CAR.
func TestNewCARUsesPrefixView(t *testing.T) {
	opts := DefaultOptions()
	opts.CARPrefillLambda = 1
	opts.Prefix = newMatches(match("b", 0, 900, 0))
	p, err := New(PolicyCAR, opts)
	if err != nil {
		t.Fatal(err)
	}
	d := route(t, p, Request{TokenIDs: tokens(1000)}, snapshot(loaded("a", F, 0, 0), loaded("b", F, 0, 0)))
	wantRoute(t, d, "b", "")
	wantFloat(t, "HitRatio", d.HitRatio, 0.9)
}

func TestRequestInputTokens(t *testing.T) {
	for _, tc := range []struct {
		r    Request
		want int
	}{
		{Request{}, 0},
		{Request{PromptTokens: 7}, 7},
		{Request{PromptTokens: -7}, 0},
		{Request{TokenIDs: tokens(3), PromptTokens: 7}, 3},
	} {
		if got := tc.r.InputTokens(); got != tc.want {
			t.Errorf("%+v.InputTokens() = %d, want %d", tc.r, got, tc.want)
		}
	}
}

// Policies are safe for concurrent use, with snapshots replaced and the
// view swapped while requests are routed; run with -race.
func TestPoliciesConcurrently(t *testing.T) {
	snapA, view := benchCluster(16, 2, 4)
	snapB, _ := benchCluster(12, 2, 3)
	snapB.Version = 2
	car := mustCAR(t, 0.5, 0.5, view)
	slo := mustSLO(t, 1000, 50)
	policies := []Policy{car, NewRR(), slo}
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			for i := range 300 {
				snap := snapA
				if (i+g)%3 == 0 {
					snap = snapB
				}
				req := Request{TokenIDs: tokens(256 + i%512)}
				for _, p := range policies {
					d, err := p.Route(req, snap)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Prefill == "" || d.Decode == "" {
						t.Errorf("%s: incomplete decision %+v", p.Name(), d)
						return
					}
					if _, ok := snap.Lookup(d.Prefill); !ok {
						t.Errorf("%s: routed to %q, not in the snapshot", p.Name(), d.Prefill)
						return
					}
				}
			}
		})
	}
	wg.Go(func() {
		for i := range 200 {
			if i%2 == 0 {
				car.SetPrefixView(nil)
			} else {
				car.SetPrefixView(view)
			}
		}
	})
	wg.Wait()
}

// Route does not modify the snapshot it reads.
func TestRouteLeavesSnapshotAlone(t *testing.T) {
	snap, view := benchCluster(8, 2, 2)
	before := make([]instance.Instance, len(snap.Instances))
	copy(before, snap.Instances)
	for _, p := range []Policy{mustCAR(t, 0.5, 0.5, view), NewRR(), mustSLO(t, 1000, 50)} {
		route(t, p, Request{TokenIDs: tokens(512)}, snap)
	}
	for i := range before {
		if before[i].Meta.Name != snap.Instances[i].Meta.Name || before[i].Load != snap.Instances[i].Load ||
			before[i].Role != snap.Instances[i].Role || before[i].State != snap.Instances[i].State {
			t.Fatalf("instance %d changed: %+v", i, snap.Instances[i])
		}
	}
}

// The decision paths allocate nothing once a policy's pool is warm (and,
// for SLO_AWARE, the snapshot's fits are built).
func TestRouteDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	snap, view := benchCluster(64, 2, 16)
	for _, tc := range []struct {
		p   Policy
		req Request
	}{
		{mustCAR(t, 0.5, 0.5, view), Request{TokenIDs: tokens(2048)}},
		{NewRR(), Request{}},
		{mustSLO(t, 1000, 50), Request{TokenIDs: tokens(2048)}},
		{mustSLO(t, 1000, 50), Request{}},
	} {
		route(t, tc.p, tc.req, snap)
		if n := testing.AllocsPerRun(100, func() { tc.p.Route(tc.req, snap) }); n != 0 {
			t.Errorf("%s: %v allocations per decision, want 0", tc.p.Name(), n)
		}
	}
}
