package cpunoise

import (
	"slices"
	"testing"
	"time"
)

const us = time.Microsecond

// TestElapsedCountsTheGapsInsideEachUnit places one 100 µs gap in 900 µs
// of running time: of 891 units of 10 µs started a microsecond apart, the
// 10 that start in the 10 µs before the gap take 110 µs, the rest 10.
func TestElapsedCountsTheGapsInsideEachUnit(t *testing.T) {
	tr := Trace{Span: 1000 * us, Threshold: us, Gaps: []Gap{{At: 500 * us, Len: 100 * us}}}
	got, err := tr.Elapsed(10*us, 891, 0.5, 0.98, 0.99, 1)
	if err != nil {
		t.Fatal(err)
	}
	if want := []time.Duration{10 * us, 10 * us, 110 * us, 110 * us}; !slices.Equal(got, want) {
		t.Fatalf("p50, p98, p99, max = %v, want %v", got, want)
	}
	if tr.PerSecond() != 1000 || tr.Lost() != 0.1 || tr.GapQuantile(0.5) != 100*us {
		t.Fatalf("per second %v, lost %v, median gap %v; want 1000, 0.1, 100µs", tr.PerSecond(), tr.Lost(), tr.GapQuantile(0.5))
	}
}

// TestElapsedAddsEveryGapOfALongUnit: a unit longer than the space
// between gaps waits for all of them.
func TestElapsedAddsEveryGapOfALongUnit(t *testing.T) {
	tr := Trace{Span: 130 * us, Threshold: us, Gaps: []Gap{{At: 10 * us, Len: 10 * us}, {At: 30 * us, Len: 20 * us}}}
	// Running time 100 µs; the gaps sit at 10 and 20 µs of it.
	got, err := tr.Elapsed(100*us, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != 130*us {
		t.Fatalf("a unit as long as the running time took %v, want the whole span, 130µs", got[0])
	}
	got, err = tr.Elapsed(5*us, 96, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != 5*us || got[1] != 25*us {
		t.Fatalf("min, max of 5 µs units = %v, want 5µs and 25µs", got)
	}
}

func TestElapsedWithoutGapsIsTheWork(t *testing.T) {
	tr := Trace{Span: time.Millisecond, Threshold: us}
	got, err := tr.Elapsed(20*us, 100, 0.5, 0.99)
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != 20*us || got[1] != 20*us {
		t.Fatalf("got %v, want 20µs twice", got)
	}
	if tr.GapQuantile(0.99) != 0 || tr.Lost() != 0 {
		t.Fatalf("a trace without gaps reports gap %v, lost %v", tr.GapQuantile(0.99), tr.Lost())
	}
}

func TestElapsedRejectsWhatItCannotPlace(t *testing.T) {
	tr := Trace{Span: 100 * us, Threshold: us, Gaps: []Gap{{At: 10 * us, Len: 50 * us}}}
	for _, c := range []struct {
		w      time.Duration
		starts int
	}{{60 * us, 10}, {0, 10}, {10 * us, 0}} {
		if _, err := tr.Elapsed(c.w, c.starts, 0.5); err == nil {
			t.Errorf("Elapsed(%v, %d) on 50µs of running time: no error", c.w, c.starts)
		}
	}
}

// TestRecordTracesThisMachine records a real trace, long enough to hold
// some of this machine's interruptions, and checks its shape: gaps in
// order, each past the threshold and inside the span, and units of work
// that take at least their own length.
func TestRecordTracesThisMachine(t *testing.T) {
	if _, err := Record(0, us); err == nil {
		t.Fatal("Record(0, …) gave no error")
	}
	if _, err := Record(time.Millisecond, 0); err == nil {
		t.Fatal("Record(…, 0) gave no error")
	}
	tr, err := Record(30*time.Millisecond, 2*us)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Span < 30*time.Millisecond || tr.Threshold != 2*us {
		t.Fatalf("span %v, threshold %v", tr.Span, tr.Threshold)
	}
	end := time.Duration(0)
	for i, g := range tr.Gaps {
		if g.Len <= tr.Threshold || g.At < end || g.At+g.Len > tr.Span {
			t.Fatalf("gap %d %+v after one ending at %v in a span of %v", i, g, end, tr.Span)
		}
		end = g.At + g.Len
	}
	if l := tr.Lost(); l < 0 || l >= 1 {
		t.Fatalf("lost %v of the span", l)
	}
	got, err := tr.Elapsed(10*us, 1000, 0.5, 0.99)
	if err != nil {
		t.Fatal(err)
	}
	if got[0] < 10*us || got[1] < got[0] {
		t.Fatalf("10 µs units: p50 %v, p99 %v", got[0], got[1])
	}
	t.Logf("%d gaps over %v (%.0f/s), %.2f%% lost, median gap %v; 10 µs of work: p50 %v, p99 %v",
		len(tr.Gaps), tr.Span, tr.PerSecond(), 100*tr.Lost(), tr.GapQuantile(0.5), got[0], got[1])
}
