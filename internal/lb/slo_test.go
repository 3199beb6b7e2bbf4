package lb

import (
	"strings"
	"testing"

	"github.com/kvcar/kvcar/internal/instance"
)

func mustSLO(t testing.TB, ttft, tpot int) *SLOAware {
	t.Helper()
	p, err := NewSLOAware(ttft, tpot)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// linearTTFT profiles TTFT = a + b·n ms.
func linearTTFT(a, b float64) []instance.TTFTPoint {
	var pts []instance.TTFTPoint
	for _, n := range []int{500, 1000, 2000, 4000} {
		pts = append(pts, instance.TTFTPoint{InputLen: n, TTFTMs: a + b*float64(n)})
	}
	return pts
}

// planeTPOT profiles TPOT = c0 + c1·batch + c2·batch·(avg_len − 1) ms.
func planeTPOT(c0, c1, c2 float64) []instance.TPOTPoint {
	var pts []instance.TPOTPoint
	for _, l := range []int{128, 1024, 4096} {
		for _, b := range []int{1, 4, 16} {
			pts = append(pts, instance.TPOTPoint{AvgLen: l, BatchSize: b, TPOTMs: c0 + c1*float64(b) + c2*float64(b*(l-1))})
		}
	}
	return pts
}

func profiled(in instance.Instance, ttft []instance.TTFTPoint, tpot []instance.TPOTPoint) instance.Instance {
	in.Meta.TTFTProfile, in.Meta.TPOTProfile = ttft, tpot
	return in
}

// R-CAR-9: the targets are validated non-negative, naming the flag.
func TestNewSLOAwareValidates(t *testing.T) {
	if _, err := NewSLOAware(-1, 50); err == nil || !strings.Contains(err.Error(), "--target_ttft") {
		t.Fatalf("err = %v, want one naming --target_ttft", err)
	}
	if _, err := NewSLOAware(1000, -1); err == nil || !strings.Contains(err.Error(), "--target_tpot") {
		t.Fatalf("err = %v, want one naming --target_tpot", err)
	}
	if _, err := NewSLOAware(0, 0); err != nil {
		t.Fatal(err)
	}
}

// R-CAR-9: prefill by predicted TTFT × (waiting + 1), for n = 1000:
//
//	fast: (50 + 0.1·1000) × (1 + 1) = 300 ms
//	slow: (100 + 0.3·1000) × (0 + 1) = 400 ms
//
// When both meet the target the one with fewer waiting requests wins;
// when one does, it wins; when none does, the fastest prediction wins.
func TestSLOAwarePrefillTarget(t *testing.T) {
	snap := snapshot(
		profiled(loaded("fast", F, 1, 0), linearTTFT(50, 0.1), nil),
		profiled(loaded("slow", F, 0, 0), linearTTFT(100, 0.3), nil),
	)
	for _, tc := range []struct {
		target int
		winner string
		pred   float64
		reason string
	}{
		{1000, "slow", 400, sloReasons[1][decodeAlone]},
		{350, "fast", 300, sloReasons[1][decodeAlone]},
		{200, "fast", 300, sloReasons[0][decodeAlone]},
	} {
		d := route(t, mustSLO(t, tc.target, 50), Request{TokenIDs: tokens(1000)}, snap)
		wantRoute(t, d, tc.winner, "")
		wantFloat(t, "PrefillScore", d.PrefillScore, tc.pred)
		if d.Reason != tc.reason {
			t.Fatalf("target %d: Reason %q, want %q", tc.target, d.Reason, tc.reason)
		}
	}
	// PromptTokens stand in for unknown ids.
	d := route(t, mustSLO(t, 350, 50), Request{PromptTokens: 1000}, snap)
	wantRoute(t, d, "fast", "")
}

// R-CAR-9: decode by predicted TPOT with the request joining the queue,
// for n = 1000:
//
//	d1: waiting 3 → batch 4, 4000 tokens: 10 + 1·4 + 0.001·4000 = 18 ms, load 0.2 + 3/3 = 1.2
//	d2: waiting 0 → batch 1, 1000 tokens: 20 + 0.5·1 + 0.0005·1000 = 21 ms, load 0.9 + 0/3 = 0.9
//
// Both meet 50 ms: the less loaded d2 wins. Only d1 meets 20 ms. None
// meets 10 ms: the faster d1 wins.
func TestSLOAwareDecodeTarget(t *testing.T) {
	snap := snapshot(
		loaded("p", P, 0, 0),
		profiled(loaded("d1", D, 3, 0.2), nil, planeTPOT(10, 1, 0.001)),
		profiled(loaded("d2", D, 0, 0.9), nil, planeTPOT(20, 0.5, 0.0005)),
	)
	for _, tc := range []struct {
		target int
		winner string
		pred   float64
		reason string
	}{
		{50, "d2", 21, sloReasons[1][decodeMet]},
		{20, "d1", 18, sloReasons[1][decodeMet]},
		{10, "d1", 18, sloReasons[1][decodeMissed]},
	} {
		d := route(t, mustSLO(t, 1000, tc.target), Request{TokenIDs: tokens(1000)}, snap)
		wantRoute(t, d, "p", tc.winner)
		wantFloat(t, "DecodeScore", d.DecodeScore, tc.pred)
		if d.Reason != tc.reason {
			t.Fatalf("target %d: Reason %q, want %q", tc.target, d.Reason, tc.reason)
		}
	}
}

// An instance without a profile predicts 0 ms, meets any target and
// competes on load alone.
func TestSLOAwareWithoutProfile(t *testing.T) {
	snap := snapshot(loaded("bare", F, 5, 0), profiled(loaded("fast", F, 0, 0), linearTTFT(10, 0.01), nil))
	wantRoute(t, route(t, mustSLO(t, 1000, 50), Request{PromptTokens: 100}, snap), "fast", "")
	snap = snapshot(loaded("bare", F, 0, 0), profiled(loaded("fast", F, 0, 0), linearTTFT(10, 0.01), nil))
	wantRoute(t, route(t, mustSLO(t, 1000, 50), Request{PromptTokens: 100}, snap), "bare", "")
}

// R-CAR-2: SLO_AWARE shares CAR's candidate rules.
func TestSLOAwareCandidates(t *testing.T) {
	noLoad := loaded("a", F, 0, 0)
	noLoad.HasLoad = false
	snap := snapshot(noLoad, withState(loaded("b", F, 0, 0), instance.Suspect), loaded("c", F, 9, 0), loaded("p", P, 0, 0))
	wantRoute(t, route(t, mustSLO(t, 1000, 50), Request{PromptTokens: 10}, snap), "c", "")
	_, err := mustSLO(t, 1000, 50).Route(Request{PromptTokens: 10}, snapshot(noLoad))
	wantNoCandidate(t, err, "with a load report", "1 without a first load report")
}

// A request of unknown length is routed round robin, as xllm-service
// does, which needs no load report.
func TestSLOAwareUnknownLengthRoundRobin(t *testing.T) {
	noLoad := loaded("b", F, 0, 0)
	noLoad.HasLoad = false
	snap := snapshot(loaded("a", F, 0, 0), noLoad)
	p := mustSLO(t, 1000, 50)
	var got []string
	for range 3 {
		d := route(t, p, Request{}, snap)
		if d.Reason != reasonSLOUnknownLength {
			t.Fatalf("Reason %q", d.Reason)
		}
		got = append(got, d.Prefill)
	}
	if strings.Join(got, ",") != "a,b,a" {
		t.Fatalf("sequence %v", got)
	}
	_, err := p.Route(Request{}, snapshot())
	wantNoCandidate(t, err)
}

// R-CAR-9: fits are cached per instance incarnation and refitted when
// the profile changes, even within one incarnation.
func TestSLOAwareRefitsWhenProfileChanges(t *testing.T) {
	p := mustSLO(t, 0, 50)
	a := profiled(loaded("a", F, 0, 0), linearTTFT(10, 0.1), nil)
	b := profiled(loaded("b", F, 0, 0), linearTTFT(20, 0.1), nil)
	snap := snapshot(a, b)
	wantRoute(t, route(t, p, Request{PromptTokens: 1000}, snap), "a", "")

	a.Meta.TTFTProfile = linearTTFT(30, 0.1) // a re-registration with a new profile
	next := snapshot(a, b)
	next.Version = 2
	wantRoute(t, route(t, p, Request{PromptTokens: 1000}, next), "b", "")
}

func TestSLOAwareFitCache(t *testing.T) {
	p := mustSLO(t, 1000, 50)
	snap := snapshot(profiled(loaded("a", F, 0, 0), linearTTFT(10, 0.1), planeTPOT(1, 1, 0.001)))
	t1 := p.fitsFor(snap)
	if p.fitsFor(snap) != t1 {
		t.Fatal("the same snapshot built a second table")
	}
	// Mark the fit, to tell a carried-over fit from a new one.
	sentinel := TTFTModel{Coef: [3]float64{42}}
	t1.fits[0].ttft = sentinel

	same := *snap // a new snapshot of the same registration
	same.Version = 2
	t2 := p.fitsFor(&same)
	if t2 == t1 || t2.fits[0].ttft != sentinel {
		t.Fatal("a fit of the same incarnation and profile was not carried over")
	}

	older := *snap
	older.Version = 1
	p.fitsFor(&older)
	if p.fits.Load() != t2 {
		t.Fatal("an older snapshot replaced the newest table")
	}

	replaced := snapshot(snap.Instances...)
	replaced.Version = 3
	replaced.Instances[0].Meta.IncarnationID = "inc-a-2"
	if t3 := p.fitsFor(replaced); t3.fits[0].ttft == sentinel {
		t.Fatal("a new incarnation kept the old fit")
	}
}
