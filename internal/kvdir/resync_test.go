package kvdir

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/kvevent"
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

// TestCalibrationsKeepTheirConnection covers R-REC-4's calibrations: a
// snapshot that ended with its end marker leaves its replay connection
// open for the next, so calibrations neither dial nor close one, and one
// that failed closes it, so the next asks over a new connection. The
// view stays the engine's throughout.
func TestCalibrationsKeepTheirConnection(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 64})
	lim := testLimits()
	lim.ResyncInterval = 100 * time.Millisecond
	d := newDirectory(t, lim, specOf(e, 0))
	k := StreamKey{e.Name(), 0}
	if _, err := e.StoreChain(0, seqTokens(1, 3*testBlock), kvevent.Device); err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, d, e, 0)
	requesters := func() (int, int) {
		n, conns, err := e.ReplayRequesters(0)
		if err != nil {
			t.Fatal(err)
		}
		return n, conns
	}
	eventually(t, "the first snapshot and three calibrations", 10*time.Second, func() (bool, string) {
		n, conns := requesters()
		return n >= 4, fmt.Sprintf("%d requests over %d connections", n, conns)
	})
	if n, conns := requesters(); conns != 1 {
		t.Fatalf("%d replay requests came over %d connections in turn, want 1", n, conns)
	}
	assertMatchesEngine(t, d, e, 0)

	// A calibration the engine never answers times out and takes its
	// connection with it.
	if err := e.SetReplayMode(0, enginesim.ReplayIgnore); err != nil {
		t.Fatal(err)
	}
	before, _ := requesters()
	eventually(t, "a calibration the engine ignores times out", 10*time.Second, func() (bool, string) {
		st := d.Streams()[0]
		return st.SnapshotsFailed > 0, fmt.Sprintf("%d snapshots failed", st.SnapshotsFailed)
	})
	if err := e.SetReplayMode(0, enginesim.ReplayNormal); err != nil {
		t.Fatal(err)
	}
	eventually(t, "calibrations over a new connection after the failure", 10*time.Second, func() (bool, string) {
		n, conns := requesters()
		return n > before+1 && conns == 2, fmt.Sprintf("%d requests (%d before the failure) over %d connections", n, before, conns)
	})
	m := matchOf(t, d, k, seqTokens(1, 3*testBlock))
	if !m.Synchronized || m.DeviceHitTokens != 3*testBlock {
		t.Fatalf("after the calibrations: %s", describe(m))
	}
	assertMatchesEngine(t, d, e, 0)
}
