package main

import (
	"context"
	"testing"
)

// TestShortSoak runs the soak briefly on a few streams: faults are
// injected, events applied, recoveries happen, stale-hit checks run, and
// none fails (R-REC-1: never a stale hit).
func TestShortSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("soak takes seconds")
	}
	o, err := parse([]string{"--streams=4", "--duration=4s", "--rate=30", "--fault_rate=4", "--query_clients=1"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := soak(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if r.checksFailed != 0 {
		t.Fatalf("%d checks failed: %v", r.checksFailed, r.failures)
	}
	if r.eventsApplied == 0 || r.faults == 0 || r.checks == 0 || r.queries == 0 || r.snapshotsOK == 0 || r.heapHighWater == 0 {
		t.Fatalf("soak did not exercise the directory: %+v", r)
	}
	t.Logf("events %d, snapshots %d, gaps %d, faults %d, checks %d (skipped %d), heap %d MiB",
		r.eventsApplied, r.snapshotsOK, r.gaps, r.faults, r.checks, r.checksSkipped, r.heapHighWater>>20)
}

func TestParseRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--streams=0"}, {"--streams=129"}, {"--rate=0"}, {"--duration=0s"}} {
		if _, err := parse(args); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}
