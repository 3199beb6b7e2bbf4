//go:build !race

// The race detector allocates on its own account, so these measurements
// run only in a build without it: go test -run Alloc ./internal/server/.

package server

import (
	"bufio"
	"bytes"
	"math"
	"net"
	"net/http"
	"runtime"
	"runtime/debug"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestInferenceAllocationsDoNotGrowWithPrompt covers issue 13's request
// path: once its pooled storage is warm, a completion allocates the same
// per request whatever its prompt's length, through the whole handler
// (parse, decision, relay to a real engine on loopback and back). The
// body and ids live in reused storage and the engine connection copies
// bodies through reused buffers, so a prompt 32 times longer may cost at
// most 1 KiB more, which is noise from the process's other goroutines,
// and no allocation more.
func TestInferenceAllocationsDoNotGrowWithPrompt(t *testing.T) {
	s := New(Options{Router: routerFor(t, answeringEngine(t))})
	s.SetReady(true)
	checkAllocsFlat(t, s.Handler())
}

// checkAllocsFlat fails t when a completion of 65536 prompt ids through h
// costs more than 1 KiB or any allocation more per request than one of
// 2048, once h's pooled storage is warm.
func checkAllocsFlat(t *testing.T, h http.Handler) {
	t.Helper()
	checkAllocsFlatLoop(t, func(body []byte) func() { return completionLoop(t, h, body) })
}

// checkAllocsFlatLoop is checkAllocsFlat with the requests served by what
// loop returns for a body.
func checkAllocsFlatLoop(t *testing.T, loop func(body []byte) func()) {
	t.Helper()
	// They run on one processor: on two, the runtime's per-processor
	// caches (of goroutines, of channel waiters) allocate or not
	// depending on which processor runs which goroutine, and a run's
	// count moved between 148.4 and 150.3 a request with the same bytes,
	// where one processor gives 150.0 in every run.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	least := func(ids int) (float64, float64) { return leastAllocs(loop(idsCompletion(ids))) }
	smallB, smallN := least(2048)
	largeB, largeN := least(65536)
	t.Logf("per request: 2048 ids %.0f B in %.1f allocations, 65536 ids %.0f B in %.1f allocations", smallB, smallN, largeB, largeN)
	if largeB-smallB > 1024 || largeN-smallN > 0.5 {
		t.Errorf("a prompt of 65536 ids allocates %.0f B per request in %.1f allocations, %.0f B more than one of 2048",
			largeB, largeN, largeB-smallB)
	}
}

// TestH1AllocationsDoNotGrowWithPrompt is TestInferenceAllocationsDoNotGrowWithPrompt
// through kvcar's HTTP/1.1 server over loopback: the head read, the
// response written, the body read and relayed. The client writes
// prepared bytes and reads answers into reused storage, so that what is
// counted is kvcar's (and the engine's, the same for both sizes).
func TestH1AllocationsDoNotGrowWithPrompt(t *testing.T) {
	addr, _ := h1Stack(t, Options{}, HTTP1Options{}, answeringEngine(t))
	checkAllocsFlatLoop(t, func(body []byte) func() { return h1Completions(t, addr, body) })
}

// TestH1MetricsAllocateNothingPerRequest: counting and timing a request
// (kvcar_http_requests_total, kvcar_http_request_duration_seconds) and
// its decision (kvcar_routing_decisions_total and the decision's
// histograms) costs no allocation once the series exist, and counts
// every request. The status comes from kvcar's own writer, not from a
// wrapper made per request, and the series are found by their label
// values once, not hashed again on every request.
func TestH1MetricsAllocateNothingPerRequest(t *testing.T) {
	engine := answeringEngine(t)
	body := idsCompletion(2048)
	plainAddr, _ := h1Stack(t, Options{}, HTTP1Options{}, engine)
	reg := prometheus.NewRegistry()
	countedAddr, _ := h1Stack(t, Options{Metrics: reg}, HTTP1Options{}, engine)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	plainB, plainN := leastAllocs(h1Completions(t, plainAddr, body))
	counted := h1Completions(t, countedAddr, body)
	served := 0
	countedB, countedN := leastAllocs(func() { counted(); served++ })
	t.Logf("per request: %.0f B in %.1f allocations without metrics, %.0f B in %.1f with them", plainB, plainN, countedB, countedN)
	if countedN-plainN > 0.05 {
		t.Errorf("the metrics add %.2f allocations (%.0f B) per request, want none", countedN-plainN, countedB-plainB)
	}
	// h1Completions checked every answer's 200.
	if got := requestCounts(t, reg)["code=200 route="+CompletionsPath+" "]; int(got) != served {
		t.Errorf("kvcar_http_requests_total{code=200} = %.0f, want the %d requests served", got, served)
	}
}

// h1Completions returns a client on a connection of its own to addr
// that sends one completion of body and reads its answer. It writes
// prepared bytes and reads answers into reused storage, so that what a
// measurement counts is kvcar's (and the engine's).
func h1Completions(t *testing.T, addr string, body []byte) func() {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	req := []byte(completionRequest(string(body)))
	br := bufio.NewReaderSize(c, 64<<10)
	return func() {
		if _, err := c.Write(req); err != nil {
			t.Fatal(err)
		}
		status, length := 0, -1
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				t.Fatal(err)
			}
			if status == 0 {
				status, _ = strconv.Atoi(string(bytes.Fields(line)[1]))
				continue
			}
			if len(bytes.TrimSpace(line)) == 0 {
				break
			}
			if k, v, _ := bytes.Cut(line, []byte(":")); string(k) == "Content-Length" {
				length, _ = strconv.Atoi(string(bytes.TrimSpace(v)))
			}
		}
		if status != http.StatusOK || length < 0 {
			t.Fatalf("status %d, length %d", status, length)
		}
		if _, err := br.Discard(length); err != nil {
			t.Fatal(err)
		}
	}
}

// leastAllocs returns what serve allocates per call, bytes and
// allocations, the least of three runs of 200. The counts are the whole
// process's, so what its other goroutines allocate meanwhile (an
// engine's heartbeat, a timer) adds to a measurement now and then; only
// the least of three is the request's.
func leastAllocs(serve func()) (bytesPerOp, allocsPerOp float64) {
	const runs = 200
	for range 20 {
		serve()
	}
	// No collection during the runs: it would be the process's, not the
	// request's.
	runtime.GC()
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	bytesPerOp, allocsPerOp = math.Inf(1), math.Inf(1)
	for range 3 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range runs {
			serve()
		}
		runtime.ReadMemStats(&after)
		bytesPerOp = min(bytesPerOp, float64(after.TotalAlloc-before.TotalAlloc)/runs)
		allocsPerOp = min(allocsPerOp, float64(after.Mallocs-before.Mallocs)/runs)
	}
	return bytesPerOp, allocsPerOp
}
