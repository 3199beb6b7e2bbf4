package kvdir

import (
	"testing"
	"time"
)

// Calibrations are spread over the last quarter of resync_interval_ms, so
// that streams synchronised together do not ask their engines for
// snapshots together, and none comes later than the interval says
// (R-REC-4).
func TestResyncJitterSpreadsCalibrations(t *testing.T) {
	const d = 30 * time.Second
	const n = 4000
	lo, hi := d*3/4, d+1
	var quarters [4]int
	var sum time.Duration
	for range n {
		j := resyncJitter(d)
		if j < lo || j >= hi {
			t.Fatalf("resyncJitter(%v) = %v, outside [%v, %v]", d, j, lo, d)
		}
		quarters[(j-lo)*4/(hi-lo)]++
		sum += j
	}
	// Each quarter of the range expects n/4 = 1000 draws; 800 is over six
	// standard deviations below.
	for q, c := range quarters {
		if c < 800 {
			t.Errorf("quarter %d of [%v, %v) got %d of %d draws: %v", q, lo, hi, c, n, quarters)
		}
	}
	if mean, want := sum/n, d*7/8; mean < want*99/100 || mean > want*101/100 {
		t.Errorf("mean interval %v, want %v within 1%%", mean, want)
	}
	if got := resyncJitter(time.Second); got < 750*time.Millisecond || got > time.Second {
		t.Errorf("resyncJitter(1s) = %v, outside [750ms, 1s]", got)
	}
}
