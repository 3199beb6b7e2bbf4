package lb

import (
	"strings"
	"testing"

	"github.com/kvcar/kvcar/internal/instance"
)

func rrSequence(t *testing.T, r *RR, snap *instance.Snapshot, n int) string {
	t.Helper()
	var got []string
	for range n {
		d := route(t, r, Request{}, snap)
		got = append(got, d.Prefill+">"+d.Decode)
	}
	return strings.Join(got, " ")
}

// R-CAR-9: RR takes the prefill instances in turn, in name order.
func TestRRRotatesDefaults(t *testing.T) {
	snap := snapshot(loaded("c", F, 0, 0), loaded("a", F, 0, 0), loaded("b", F, 0, 0))
	if got := rrSequence(t, NewRR(), snap, 4); got != "a> b> c> a>" {
		t.Fatalf("sequence %q", got)
	}
}

// R-CAR-9: prefill and decode instances rotate independently.
func TestRRRotatesPrefillAndDecodeIndependently(t *testing.T) {
	snap := snapshot(loaded("p1", P, 0, 0), loaded("p2", P, 0, 0), loaded("d1", D, 0, 0), loaded("d2", D, 0, 0), loaded("d3", D, 0, 0))
	want := "p1>d1 p2>d2 p1>d3 p2>d1 p1>d2 p2>d3"
	if got := rrSequence(t, NewRR(), snap, 6); got != want {
		t.Fatalf("sequence %q, want %q", got, want)
	}
}

// R-CAR-9, R-CAR-2: SUSPECT instances are skipped; LEASE_LOST ones and
// ones without a load report take their turns, as in xllm-service.
func TestRRSkipsSuspectOnly(t *testing.T) {
	noLoad := loaded("c", F, 0, 0)
	noLoad.HasLoad, noLoad.LoadValid = false, false
	snap := snapshot(loaded("a", F, 0, 0), withState(loaded("b", F, 0, 0), instance.Suspect), noLoad,
		withState(loaded("d", F, 0, 0), instance.LeaseLost))
	if got := rrSequence(t, NewRR(), snap, 4); got != "a> c> d> a>" {
		t.Fatalf("sequence %q", got)
	}
	snap = snapshot(loaded("p", P, 0, 0), loaded("d1", D, 0, 0), withState(loaded("d2", D, 0, 0), instance.Suspect), loaded("d3", D, 0, 0))
	if got := rrSequence(t, NewRR(), snap, 3); got != "p>d1 p>d3 p>d1" {
		t.Fatalf("sequence %q", got)
	}
}

// R-CAR-2: a DEFAULT serves alone and takes no decode turn; a PREFILL
// without a decode instance takes no prefill turn.
func TestRRDefaultAloneAndPrefillNeedsDecode(t *testing.T) {
	snap := snapshot(loaded("f", F, 0, 0), loaded("p", P, 0, 0), loaded("d1", D, 0, 0), loaded("d2", D, 0, 0))
	if got := rrSequence(t, NewRR(), snap, 4); got != "f> p>d1 f> p>d2" {
		t.Fatalf("sequence %q", got)
	}
	snap = snapshot(loaded("f", F, 0, 0), loaded("p", P, 0, 0), withState(loaded("d", D, 0, 0), instance.Suspect))
	if got := rrSequence(t, NewRR(), snap, 2); got != "f> f>" {
		t.Fatalf("sequence %q", got)
	}
	_, err := NewRR().Route(Request{}, snapshot(loaded("p", P, 0, 0)))
	wantNoCandidate(t, err, "no schedulable PREFILL or DEFAULT instance (", "only DEFAULT may serve alone")
	_, err = NewRR().Route(Request{}, snapshot(withState(loaded("f", F, 0, 0), instance.Suspect)))
	wantNoCandidate(t, err, "1 SUSPECT")
}

// R-CAR-2: MIX instances take turns on the side of their role.
func TestRRMixByRole(t *testing.T) {
	snap := snapshot(mix("m1", P, 0, 0), mix("m2", D, 0, 0), loaded("p", P, 0, 0))
	if got := rrSequence(t, NewRR(), snap, 2); got != "m1>m2 p>m2" {
		t.Fatalf("sequence %q", got)
	}
}

// Turns belong to a policy value.
func TestRRTurnsArePerPolicy(t *testing.T) {
	snap := snapshot(loaded("a", F, 0, 0), loaded("b", F, 0, 0))
	r1, r2 := NewRR(), NewRR()
	route(t, r1, Request{}, snap)
	if d := route(t, r2, Request{}, snap); d.Prefill != "a" {
		t.Fatalf("a second policy started at %q", d.Prefill)
	}
}
