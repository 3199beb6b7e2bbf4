package main

import (
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/devcluster"
)

// TestShortRunIsSane runs the program on the real binary with a short
// window: every cell completes without an error, kvcar's cells carry a
// CPU time, and the table has a row per cell with the ratios to direct
// (issue 13's request path benchmark).
func TestShortRunIsSane(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kvcar and runs it as a process")
	}
	bin, err := devcluster.BuildKVCar(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	o, err := parse([]string{"--kvcar=" + bin, "--concurrency=1,4", "--prompt_ids=2048", "--policies=RR,CAR",
		"--duration=700ms", "--warmup=200ms", "--prompts=16"})
	if err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	rep, err := run(t.Context(), o, &log)
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if len(rep.cells) != 6 {
		t.Fatalf("%d cells, want 6 (direct, RR, CAR at 2 concurrencies)", len(rep.cells))
	}
	for _, c := range rep.cells {
		if c.errors() != 0 || c.requests < 10 || c.p50 <= 0 || c.p99 < c.p50 || c.window != 700*time.Millisecond {
			t.Errorf("%s c=%d: %d answered, %d errors (%s), p50 %v p99 %v", c.target, c.conc, c.requests, c.errors(), errorsText(c), c.p50, c.p99)
		}
		// kvcar parses every body and relays it: it cannot have used no
		// CPU, nor a whole core for each request.
		if perReq := c.cpuPerRequest(); (c.target == "direct") != (perReq == 0) || perReq > 100*time.Millisecond {
			t.Errorf("%s c=%d: kvcar CPU per request %v", c.target, c.conc, perReq)
		}
	}
	var out strings.Builder
	rep.write(&out, true)
	table := out.String()
	t.Log(table)
	for _, want := range []string{"Generated ", "| CAR | 2048 | 4 |", "| RR | 2048 | 1 |", "| direct | 2048 | 4 |", "kvcar-load --kvcar="} {
		if !strings.Contains(table, want) {
			t.Errorf("report lacks %q", want)
		}
	}
}

func TestParseRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--concurrency=0"}, {"--concurrency=1,x"}, {"--prompt_ids=0"}, {"--policies=FASTEST"},
		{"--engines=0"}, {"--duration=0s"}, {"--prompts=0"}, {"--engine_idle_timeout=-1s"}} {
		if _, err := parse(args); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}
