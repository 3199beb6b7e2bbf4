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

// A calibration in progress waits for its replies: its stream goroutine
// does not spin until the snapshot ends because the calibration time
// that started it lies in the past (R-REC-4 calibrations cost what
// their replies cost, not a core for as long as they last). The engine
// answers slowly, 100 ms before each of two batches.
func TestCalibrationWaitsForReplies(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 64, SnapshotBatchBlocks: 8, ReplaySlowDelay: 100 * time.Millisecond})
	if _, err := e.StoreChain(0, seqTokens(1, 12*testBlock), kvevent.Device); err != nil {
		t.Fatal(err)
	}
	lim := testLimits()
	lim.ResyncInterval = 100 * time.Millisecond
	d := newDirectory(t, lim, specOf(e, 0))
	k := StreamKey{e.Name(), 0}
	waitSynced(t, d, k, 0)
	if err := e.SetReplayMode(0, enginesim.ReplaySlow); err != nil {
		t.Fatal(err)
	}
	s := d.streamOf(k)
	ok0 := s.counters.snapshotsOK.Load()
	for s.counters.snapshotsOK.Load() == ok0 { // a calibration may be under way
		time.Sleep(time.Millisecond)
	}
	ok1, waits1 := s.counters.snapshotsOK.Load(), s.counters.waits.Load()
	eventually(t, "three slow calibrations", 10*time.Second, func() (bool, string) {
		n := s.counters.snapshotsOK.Load() - ok1
		return n >= 3, fmt.Sprintf("%d calibrations", n)
	})
	n := s.counters.snapshotsOK.Load() - ok1
	waits := s.counters.waits.Load() - waits1
	// Per calibration: the request (a few 1 ms retries while the
	// connection comes up), two replies and the end marker, the timer
	// that starts the next one. A spinning wait makes thousands.
	if perCal := waits / n; perCal > 40 {
		t.Fatalf("%d waits over %d calibrations of ~200 ms each: %d per calibration", waits, n, perCal)
	}
	t.Logf("%d waits over %d calibrations", waits, n)
	assertMatchesEngine(t, d, e, 0)
}

// A snapshot taken while a block's parent is evicted from both tiers sees
// the block as an orphan, which it cannot key; it keeps the key the view
// it replaces had for it (R-IDX-5): the served view for a calibration
// (R-REC-4) or a full-state batch (R-WIRE-4), the view a gap withdrew for
// a recovery (R-REC-3). When the
// parent is stored again, the engine announces the parent alone, and the
// prefix through the block, still on Host, is a hit again.
func TestSnapshotsKeepKeysOfOrphans(t *testing.T) {
	for _, how := range []string{"calibration", "recovery after a gap", "full-state batch"} {
		t.Run(how, func(t *testing.T) {
			e := startEngine(t, enginesim.Config{DeviceBlocks: 64, HostBlocks: 64})
			lim := testLimits()
			if how == "calibration" {
				lim.ResyncInterval = 100 * time.Millisecond
			}
			d := newDirectory(t, lim, specOf(e, 0))
			k := StreamKey{e.Name(), 0}
			waitSynced(t, d, k, 0)
			prompt := seqTokens(1, 3*testBlock)
			hashes, err := e.StoreChain(0, prompt, kvevent.Host)
			if err != nil {
				t.Fatal(err)
			}
			waitCaughtUp(t, d, e, 0) // the served view knows the blocks' keys
			// Block 0 leaves Host: blocks 1 and 2 are orphans on Host.
			if err := e.Remove(0, hashes[:1], kvevent.Host); err != nil {
				t.Fatal(err)
			}
			waitCaughtUp(t, d, e, 0)
			s := d.streamOf(k)
			ok0 := s.counters.snapshotsOK.Load()
			switch how {
			case "calibration":
				eventually(t, "a calibration after the eviction", 10*time.Second, func() (bool, string) {
					n := s.counters.snapshotsOK.Load() - ok0
					return n >= 2, fmt.Sprintf("%d calibrations", n)
				})
			case "recovery after a gap":
				if err := e.SkipSeq(0, 1); err != nil {
					t.Fatal(err)
				}
				if _, err := e.StoreChain(0, seqTokens(500, testBlock), kvevent.Device); err != nil {
					t.Fatal(err)
				}
				eventually(t, "a recovery after the gap", 10*time.Second, func() (bool, string) {
					n := s.counters.snapshotsOK.Load() - ok0
					return n >= 1, fmt.Sprintf("%d snapshots", n)
				})
			default:
				full0 := s.counters.fullStateSyncs.Load()
				if err := e.SendFullState(0); err != nil {
					t.Fatal(err)
				}
				eventually(t, "the full-state batch applied", 10*time.Second, func() (bool, string) {
					n := s.counters.fullStateSyncs.Load() - full0
					return n >= 1, fmt.Sprintf("%d full-state batches", n)
				})
			}
			if _, err := e.StoreChain(0, prompt[:testBlock], kvevent.Device); err != nil {
				t.Fatal(err)
			}
			waitCaughtUp(t, d, e, 0)
			if dev, host := e.Oracle(0, prompt); dev != testBlock || host != 2*testBlock {
				t.Fatalf("engine reuses device=%d host=%d, want the root on Device and two blocks on Host", dev, host)
			}
			assertQueryMatchesOracle(t, d, e, 0, prompt)
			assertMatchesEngine(t, d, e, 0)
		})
	}
}
