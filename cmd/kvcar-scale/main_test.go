package main

import (
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/cpunoise"
	"github.com/kvcar/kvcar/internal/devcluster"
)

// TestQueriesDuringLoadHit runs a small scale measurement on the real
// binary: the queries are sent while the engines prefill, are built on
// prompts the engines served, and hit (R-API-4: the instance that served
// a prompt reports it held; the others the shared system prompt); the
// completions routed meanwhile go to the engine that holds their prompt
// (R-CAR-1) and report their decision time; calibrations every second
// (R-REC-4) are counted.
func TestQueriesDuringLoadHit(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kvcar and runs it as a process")
	}
	bin, err := devcluster.BuildKVCar(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	o, err := parse([]string{"--kvcar=" + bin, "--port=0", "--internal_port=0", "--streams=4", "--rate=10",
		"--duration=3s", "--block_size=16", "--prompt_blocks=4", "--query_rate=40", "--query_tokens=512", "--route_rate=20", "--resync_interval=1s",
		"--noise=200ms"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := measure(t.Context(), o, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	r.print(&out, o)
	t.Log(out.String())
	// BuildKVCar stamps the tree's revision, so the binary and this
	// driver name the same commit.
	for _, want := range []string{"commit " + devcluster.Revision(), "idle CPUs: cpuidle "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report does not name %q", want)
		}
	}
	q := r.queries
	if r.synced != o.streams || r.blocks == 0 || len(q.server) == 0 || q.failed != 0 {
		t.Fatalf("load or queries did not run: %d of %d streams synchronised, %d blocks, %d answered, %d failed",
			r.synced, o.streams, r.blocks, len(q.server), q.failed)
	}
	// The window is 3 s at 40 queries a second; the first 200 ms have no
	// settled prompt.
	if q.withPrompt < 60 || q.hits < q.withPrompt*9/10 || q.sharedHits < q.withPrompt*9/10 {
		t.Fatalf("of %d queries on served prompts, %d hit the serving engine and %d the system prompt on the others",
			q.withPrompt, q.hits, q.sharedHits)
	}
	rt := r.routes
	if rt.failed != 0 || rt.withPrompt < 30 || rt.toServer < rt.withPrompt*9/10 || len(rt.decision) < rt.withPrompt {
		t.Fatalf("of %d completions (%d failed), %d on served prompts, %d went to the serving engine",
			len(rt.decision), rt.failed, rt.withPrompt, rt.toServer)
	}
	// Each stream calibrates at a random point of the last quarter of
	// every second: at least twice in the 3 s window.
	if r.snapshots < uint64(2*o.streams) || r.snapshotsFailed != 0 {
		t.Fatalf("%d calibrations succeeded and %d failed in the window, want at least %d and none", r.snapshots, r.snapshotsFailed, 2*o.streams)
	}
	if !strings.Contains(out.String(), "(calibrations every 1s per stream)") {
		t.Error("the report does not name the calibration period")
	}
	// The machine's interruptions were recorded, and the decision's bound
	// reported from them.
	for _, n := range []cpunoise.Trace{r.noise, r.noiseAfter} {
		if n.Span < o.noise || n.Threshold != cpunoise.Threshold {
			t.Fatalf("interruptions recorded over %v with threshold %v, want %v and %v", n.Span, n.Threshold, o.noise, cpunoise.Threshold)
		}
	}
	for _, want := range []string{
		" before kvcar started (gaps > 2µs): per second",
		" after kvcar stopped (gaps > 2µs): per second",
		"of CPU work (the decision's p50) started anywhere in the trace before kvcar started",
		"of CPU work (the decision's p50) started anywhere in the trace after kvcar stopped",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	// At 20 completions a second CAR's decisions are sparser than the
	// keep-warm interval, so dry decisions run between them and are
	// reported.
	if !r.dry.served || r.dry.n == 0 || r.dry.took <= 0 || !strings.Contains(out.String(), "| CAR's dry decisions during the window (--car_keep_warm_interval_us): count / share of one core | ") {
		t.Errorf("dry decisions in the window: %+v", r.dry)
	}
	if r.promptTokensMax != (systemBlocks+4)*16 {
		t.Fatalf("held prompt reported as %d tokens", r.promptTokensMax)
	}
}

func TestHitAllNeedsTheServingInstanceAndTheSharedPrefix(t *testing.T) {
	ms := []match{
		{InstanceName: "a", Synchronized: true, DeviceHitTokens: 128},
		{InstanceName: "b", Synchronized: true, DeviceHitTokens: 64},
		{InstanceName: "c", Synchronized: false},
	}
	for _, c := range []struct {
		instance     string
		want, shared int
		own, others  bool
	}{
		{"a", 128, 64, true, true},
		{"a", 192, 64, false, true},  // the serving instance misses part of its prompt
		{"a", 128, 128, true, false}, // another one misses the shared prefix
		{"c", 0, 0, false, true},     // unsynchronised: holds nothing
		{"x", 0, 0, false, true},     // not in the answer
	} {
		if own, others := hitAll(ms, c.instance, c.want, c.shared); own != c.own || others != c.others {
			t.Errorf("hitAll(%s, %d, %d) = %v, %v, want %v, %v", c.instance, c.want, c.shared, own, others, c.own, c.others)
		}
	}
}

func TestParseRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--streams=0"}, {"--streams=129"}, {"--query_rate=-1"}, {"--query_tokens=0"},
		{"--route_rate=-1"}, {"--rate=0"}, {"--duration=0s"}, {"--prompt_blocks=0"},
		{"--kvcar_cpus=x"}, {"--kvcar_cpus=-1"}, {"--driver_cpus=4096"}, {"--driver_cpus=1-0"},
		{"--resync_interval=500ms"}, {"--resync_interval=-1s"}, {"--noise=-1s"}, {"--noise=2m"}} {
		if _, err := parse(args); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

func TestParseKVCarArgs(t *testing.T) {
	o, err := parse([]string{"--kvcar_args= --car_dispatch_accounting  --car_dispatch_token_weight=0.5 "})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"--car_dispatch_accounting", "--car_dispatch_token_weight=0.5"}; !slices.Equal(o.kvcarArgs, want) {
		t.Fatalf("kvcar's further flags %q, want %q", o.kvcarArgs, want)
	}
}

// At a high prefill rate the prompts kept must still reach back past
// settle, or pick finds none and every completion is a cold prompt; and
// what is kept stays bounded by the rate.
func TestRecentPromptsReachPastSettle(t *testing.T) {
	r := newRecentPrompts(1)
	t0 := time.Now()
	const period = 25 * time.Millisecond // 40 prefills a second
	n := 0
	for at := t0; at.Before(t0.Add(2 * time.Second)); at = at.Add(period) {
		r.put(0, []uint32{uint32(n)}, at)
		n++
	}
	last := t0.Add(time.Duration(n-1) * period)
	got, ok := r.servedBefore(0, last.Add(-settle))
	if !ok {
		t.Fatalf("no prompt served %v before the newest of %d, 25ms apart", settle, n)
	}
	if want := uint32(n - 2 - int(settle/period)); got[0] != want { // servedBefore is strict
		t.Fatalf("newest prompt served %v before the last is #%d, want #%d", settle, got[0], want)
	}
	if kept, most := len(r.byEngine[0]), int(settle/period)+2; kept > most {
		t.Fatalf("%d prompts kept, more than the %d settle and the one before need", kept, most)
	}
}

// A driver that used nearly all its CPUs says so beside its measures: its
// emulated engines and clients ran late, which its client's times include.
func TestReportNotesASaturatedDriver(t *testing.T) {
	o := options{streams: 1, driverCPUs: devcluster.CPUList{0}}
	for _, c := range []struct {
		self time.Duration
		note bool
	}{{9500 * time.Millisecond, true}, {5 * time.Second, false}} {
		r := &result{wall: 10 * time.Second, selfCPU: c.self}
		var b strings.Builder
		r.print(&b, o)
		if got := strings.Contains(b.String(), "| note | this driver used over 90% of the 1 CPU(s)"); got != c.note {
			t.Errorf("driver at %v of CPU over 10s on 1 CPU: note %v, want %v\n%s", c.self, got, c.note, b.String())
		}
	}
}
