package cpunoise

import (
	"fmt"
	"runtime"
	"slices"
	"time"
)

// Gap is one interruption: At is when it began, from the start of the
// trace, and Len how long the thread did not run.
type Gap struct {
	At, Len time.Duration
}

// Trace is what a busy thread saw of its CPU over Span: the gaps longer
// than Threshold, in order. Shorter ones (the clock's own cost, cache
// misses) are counted as running time.
type Trace struct {
	Span      time.Duration
	Threshold time.Duration
	Gaps      []Gap
}

// Threshold is the shortest gap kvcar's measurements count as an
// interruption, far above a clock read or a cache miss; Starts is how
// many units of work their bounds place over a trace. Every bound
// kvcar reports uses both, so that the bounds compare.
const (
	Threshold = 2 * time.Microsecond
	Starts    = 100_000
)

// maxGaps bounds a trace's memory: at 100,000 interruptions a second, a
// rate no usable machine has, a second's trace.
const maxGaps = 100_000

// Record reads the clock in a loop for d on the calling goroutine's
// thread, which it locks for the time, and returns the gaps longer than
// threshold. It keeps a CPU busy for d: run it where the work it stands
// for would run, and not beside that work. A trace that would pass
// maxGaps gaps ends early, with Span saying how long it ran.
func Record(d, threshold time.Duration) (Trace, error) {
	if d <= 0 || threshold <= 0 {
		return Trace{}, fmt.Errorf("cpunoise: recording for %v with threshold %v: both must be positive", d, threshold)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	t := Trace{Threshold: threshold}
	start := time.Now()
	last := start
	for {
		now := time.Now()
		if g := now.Sub(last); g > threshold {
			t.Gaps = append(t.Gaps, Gap{At: last.Sub(start), Len: g})
		}
		last = now
		if now.Sub(start) >= d || len(t.Gaps) == maxGaps {
			t.Span = now.Sub(start)
			return t, nil
		}
	}
}

// PerSecond is how many gaps the trace saw per second.
func (t Trace) PerSecond() float64 {
	if t.Span <= 0 {
		return 0
	}
	return float64(len(t.Gaps)) / t.Span.Seconds()
}

// Lost is the fraction of the span the thread did not run.
func (t Trace) Lost() float64 {
	if t.Span <= 0 {
		return 0
	}
	var sum time.Duration
	for _, g := range t.Gaps {
		sum += g.Len
	}
	return sum.Seconds() / t.Span.Seconds()
}

// GapQuantile is the q-quantile of the gaps' lengths (0 without gaps).
func (t Trace) GapQuantile(q float64) time.Duration {
	if len(t.Gaps) == 0 {
		return 0
	}
	lens := make([]time.Duration, len(t.Gaps))
	for i, g := range t.Gaps {
		lens[i] = g.Len
	}
	slices.Sort(lens)
	return lens[quantileIndex(len(lens), q)]
}

// Elapsed returns, for each q in qs, the q-quantile of how long a unit of
// work w long takes on the traced CPU: the unit is started at starts
// points spread evenly over the trace's running time, and each takes w
// plus every gap that falls before it is done. It is the bound of any
// code that needs w of CPU there: the same work, only ever delayed by
// the machine.
func (t Trace) Elapsed(w time.Duration, starts int, qs ...float64) ([]time.Duration, error) {
	run := t.Span
	for _, g := range t.Gaps {
		run -= g.Len
	}
	if w <= 0 || starts <= 0 || run < w {
		return nil, fmt.Errorf("cpunoise: %d units of %v over %v of running time: need a positive unit no longer than the running time and at least one start", starts, w, run)
	}
	// A gap's place on the running-time axis: the running time before
	// it. Units start in [0, run-w], so each ends inside the trace.
	at := make([]time.Duration, len(t.Gaps))
	var before time.Duration
	for i, g := range t.Gaps {
		at[i] = g.At - before
		before += g.Len
	}
	out := make([]time.Duration, starts)
	lo, hi := 0, 0 // gaps with at in [s, s+w) are at[lo:hi]
	var inside time.Duration
	for i := range starts {
		s := time.Duration(0)
		if starts > 1 {
			s = (run - w) * time.Duration(i) / time.Duration(starts-1)
		}
		for hi < len(at) && at[hi] < s+w {
			inside += t.Gaps[hi].Len
			hi++
		}
		for lo < hi && at[lo] < s {
			inside -= t.Gaps[lo].Len
			lo++
		}
		out[i] = w + inside
	}
	slices.Sort(out)
	res := make([]time.Duration, len(qs))
	for i, q := range qs {
		res[i] = out[quantileIndex(len(out), q)]
	}
	return res, nil
}

func quantileIndex(n int, q float64) int {
	return min(n-1, max(0, int(q*float64(n))))
}
