package main

import (
	"context"
	"strings"
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
	o.minProbes = 2
	r, err := soak(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	r.print(&out, o)
	t.Log("\n" + out.String())
	if n := r.failed(); n != 0 {
		t.Fatalf("%d checks failed", n)
	}
	if r.eventsApplied == 0 || r.faults == 0 || r.checks == 0 || r.probes == 0 || r.unsyncAnswers == 0 ||
		r.queries == 0 || r.snapshotsOK == 0 || r.lostMessages == 0 || r.gaps == 0 || r.heapHighWater.Load() == 0 {
		t.Fatal("soak did not exercise the directory")
	}
}

// TestPlantedBugs shows the checker is not vacuous: it passes the
// directory as built and fails each deliberately broken one, the bugs it
// once let through (R-REC-1: no hit while unsynchronised, R-REC-3: a
// sequence gap is noticed, R-IDX-3: hits exact once caught up). The table
// it logs is the one in README.md.
func TestPlantedBugs(t *testing.T) {
	if testing.Short() {
		t.Skip("each soak takes seconds")
	}
	args := []string{"--streams=3", "--duration=3s", "--rate=30", "--fault_rate=4", "--query_clients=1"}
	o, err := parse(args)
	if err != nil {
		t.Fatal(err)
	}
	// Six probes, not two: on a loaded machine a 3 s run can end after
	// two, and a probe made while an injected fault has already taken
	// the stream out of sync cannot show a gap the relay hid (CI once
	// saw the gap filler go uncaught that way, 2 probes in its run).
	o.minProbes = 6
	table := []string{"| planted bug | failed checks | by kind | exact checks / loss probes / unsynchronised answers checked |", "|---|---:|---|---|"}
	for _, c := range []struct {
		name   string
		pl     plant
		broken bool
	}{
		{"none: the directory as built", plant{}, false},
		{"every query reports zero hits", plant{view: func(v view) view { return zeroHits{v} }}, true},
		{"an unsynchronised stream keeps its old view", plant{view: newKeepOldView}, true},
		{"sequence gaps ignored", plant{relay: newGapFiller}, true},
	} {
		r, err := soakWith(context.Background(), o, c.pl)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		table = append(table, plantRow(c.name, r))
		if r.checks == 0 || r.probes == 0 {
			t.Errorf("%s: the checker did not run (%d checks, %d probes)", c.name, r.checks, r.probes)
		}
		switch n := r.failed(); {
		case !c.broken && n != 0:
			t.Errorf("%s: %d checks failed: %v", c.name, n, r.examples)
		case c.broken && n == 0:
			t.Errorf("%s: not caught", c.name)
		}
	}
	t.Logf("kvcar-soak %s\n%s", strings.Join(args, " "), strings.Join(table, "\n"))
}

func TestParseRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--streams=0"}, {"--streams=129"}, {"--rate=0"}, {"--duration=0s"}} {
		if _, err := parse(args); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}
