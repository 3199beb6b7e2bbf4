package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/devcluster"
)

// TestMain serves the relay bound when the test binary is run again as
// one, as kvcar-load's main does.
func TestMain(m *testing.M) {
	if engines := os.Getenv(relayEnv); engines != "" {
		if err := runRelay(engines); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	os.Exit(m.Run())
}

// TestShortRunIsSane runs the program on the real binary with a short
// window: every cell completes without an error, kvcar's cells carry a
// CPU time, each next to the same load sent directly, and the table has a
// row per cell with the ratios to direct
// (issue 13's request path benchmark).
func TestShortRunIsSane(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kvcar and runs it as a process")
	}
	// A revision of its own, so the report can only have it from the
	// binary.
	const kvcarRev = "kvcar-load-test"
	bin, err := devcluster.BuildKVCarRevision(t.Context(), t.TempDir(), kvcarRev)
	if err != nil {
		t.Fatal(err)
	}
	rep := shortRun(t, "--kvcar="+bin, "--concurrency=1,4", "--policies=RR,CAR")
	if len(rep.cells) != 8 {
		t.Fatalf("%d cells, want 8 (RR, CAR and the relay bound before each at 2 concurrencies)", len(rep.cells))
	}
	for _, c := range rep.cells {
		for _, x := range []*cell{c, c.direct} {
			if x.errors() != 0 || x.requests < 10 || x.p50 <= 0 || x.p99 < x.p50 || x.window != 700*time.Millisecond {
				t.Errorf("%s c=%d: %d answered, %d errors (%s), p50 %v p99 %v", x.target, x.conc, x.requests, x.errors(), errorsText(x), x.p50, x.p99)
			}
		}
		// kvcar and the relay bound relay every body: neither can have
		// used no CPU, nor a whole core for each request; the direct load
		// is neither's.
		if perReq := c.cpuPerRequest(); perReq <= 0 || perReq > 100*time.Millisecond || c.direct.cpuPerRequest() != 0 {
			t.Errorf("%s c=%d: kvcar CPU per request %v, direct %v", c.target, c.conc, perReq, c.direct.cpuPerRequest())
		}
	}
	var out strings.Builder
	rep.write(&out, true)
	table := out.String()
	t.Log(table)
	generated := "from kvcar commit " + kvcarRev + " (driver commit " + devcluster.Revision() + ") in "
	for _, want := range []string{"Generated ", generated, "| CAR | 2048 | 4 |", "| RR | 2048 | 1 |", "| relay bound | 2048 | 4 |", "kvcar-load --kvcar=", "Idle CPUs: cpuidle "} {
		if !strings.Contains(table, want) {
			t.Errorf("report lacks %q", want)
		}
	}
}

// shortRun runs the program with args and a short configuration: 2,048
// ids, a 700 ms window after 200 ms of warm-up, 16 prompts.
func shortRun(t *testing.T, args ...string) *report {
	t.Helper()
	o, err := parse(append(args, "--prompt_ids=2048", "--duration=700ms", "--warmup=200ms", "--prompts=16"))
	if err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	rep, err := run(t.Context(), o, &log)
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	return rep
}

func TestParseRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--concurrency=0"}, {"--concurrency=1,x"}, {"--prompt_ids=0"}, {"--policies=FASTEST"},
		{"--engines=0"}, {"--duration=0s"}, {"--prompts=0"}, {"--engine_idle_timeout=-1s"},
		{"--kvcar_cpus=a"}, {"--driver_cpus=4096"}, {"--max_tokens=0"}, {"--max_tokens=4097"}, {"--stream"}} {
		if _, err := parse(args); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

// TestShortStreamedRun streams 8 tokens a request through kvcar on both
// backends: over HTTP the engines' SSE events are relayed, over
// baidu_std each token is a Generations call kvcar turns into an event.
// Every answer must end with "data: [DONE]".
func TestShortStreamedRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kvcar and runs it as a process")
	}
	bin, err := devcluster.BuildKVCarRevision(t.Context(), t.TempDir(), "kvcar-load-test")
	if err != nil {
		t.Fatal(err)
	}
	for _, backend := range []string{backendVLLM, backendXLLM} {
		t.Run(backend, func(t *testing.T) {
			rep := shortRun(t, "--kvcar="+bin, "--backend="+backend, "--concurrency=2", "--policies=CAR",
				"--max_tokens=8", "--stream", "--bound=false")
			if len(rep.cells) != 1 {
				t.Fatalf("%d cells, want 1", len(rep.cells))
			}
			for _, x := range []*cell{rep.cells[0], rep.cells[0].direct} {
				if x.errors() != 0 || x.requests < 10 {
					t.Errorf("%s: %d answered, %d errors (%s)", x.target, x.requests, x.errors(), errorsText(x))
				}
			}
			var out strings.Builder
			rep.write(&out, true)
			if !strings.Contains(out.String(), "max_tokens 8, streamed") {
				t.Errorf("report does not say the output was streamed:\n%s", out.String())
			}
		})
	}
}

// An answer that ends early is counted as cut, not as an answered
// request: a stream without its end marker, a body that is no JSON
// object.
func TestSendTellsCutAnswers(t *testing.T) {
	for _, tc := range []struct {
		body   string
		stream bool
		whole  bool
	}{
		{"data: {}\n\ndata: [DONE]\n\n", true, true},
		{"data: {}\n\n", true, false},
		{"", true, false},
		{`{"choices":[]}` + "\n", false, true},
		{`{"choices":[`, false, false},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, tc.body)
		}))
		status, whole := send(t.Context(), srv.Client(), srv.URL, []byte("{}"), tc.stream, make([]byte, 8))
		srv.Close()
		if status != http.StatusOK || whole != tc.whole {
			t.Errorf("%q (stream %v): status %d whole %v, want 200 %v", tc.body, tc.stream, status, whole, tc.whole)
		}
	}
}
