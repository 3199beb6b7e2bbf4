package enginesim

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"
)

// httpGet fetches http://addr/path and returns status and body.
func httpGet(t *testing.T, addr, path string) (int, string, error) {
	t.Helper()
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	c.CloseIdleConnections()
	return resp.StatusCode, string(b), nil
}

func wantHealth(t *testing.T, addr string, status int) {
	t.Helper()
	code, body, err := httpGet(t, addr, "/health")
	if err != nil {
		t.Fatalf("GET /health: %v", err)
	}
	if code != status || (status == http.StatusOK && body != "ok") {
		t.Fatalf("GET /health = %d %q, want %d", code, body, status)
	}
}

// R-DISC-4: /health is what kvcar probes when a key disappears; it
// answers 200 "ok" unless made unhealthy, and an empty Name becomes the
// bound address. Restart keeps serving; Close stops; Start again comes
// back on the same address.
func TestHealthEndpointRDISC4(t *testing.T) {
	e, err := New(Config{HTTPAddr: "127.0.0.1:0", BlockSize: testBS})
	must(t, err)
	must(t, e.Start())
	t.Cleanup(func() { must(t, e.Close()) })
	addr := e.HTTPAddr()
	if _, port, _ := net.SplitHostPort(addr); port == "0" || e.Name() != addr {
		t.Fatalf("HTTPAddr %q, Name %q", addr, e.Name())
	}
	wantHealth(t, addr, http.StatusOK)
	e.SetHealthy(false)
	wantHealth(t, addr, http.StatusServiceUnavailable)
	e.SetHealthy(true)

	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Post("http://"+addr+"/health", "text/plain", nil)
	must(t, err)
	resp.Body.Close()
	c.CloseIdleConnections()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST /health = %d", resp.StatusCode)
	}

	must(t, e.Restart())
	if e.HTTPAddr() != addr {
		t.Fatalf("restart moved HTTP from %s to %s", addr, e.HTTPAddr())
	}
	wantHealth(t, addr, http.StatusOK)

	must(t, e.Close())
	if _, _, err := httpGet(t, addr, "/health"); err == nil {
		t.Fatal("closed engine still answers /health")
	}
	must(t, e.Start())
	if e.HTTPAddr() != addr {
		t.Fatalf("start after close moved HTTP from %s to %s", addr, e.HTTPAddr())
	}
	wantHealth(t, addr, http.StatusOK)
}

// R-DISC-2, R-DISC-6: the free base port leaves the HTTP port and every
// derived port free and within range; impossible offsets are refused.
func TestFreeDiscoveryPortRDISC2(t *testing.T) {
	port, err := FreeDiscoveryPort(3, DefaultEventPortOffset, DefaultReplayPortOffset)
	must(t, err)
	if port < 1024 || port+DefaultReplayPortOffset+2 > 65535 {
		t.Fatalf("base port %d out of range", port)
	}
	for _, p := range []int{port, port + 10000, port + 10002, port + 30000, port + 30002} {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("port %d of base %d is not free: %v", p, port, err)
		}
		l.Close()
	}
	for _, c := range []struct{ dp, ev, rp int }{
		{2, 100, 101},     // replay of dp 0 on event of dp 1
		{1, 0, 100},       // events on the HTTP port
		{1, 70000, 1},     // beyond 65535 whatever the base
		{0, 10000, 30000}, // no ranks
	} {
		if p, err := FreeDiscoveryPort(c.dp, c.ev, c.rp); err == nil {
			t.Fatalf("dp %d offsets %d/%d gave port %d", c.dp, c.ev, c.rp, p)
		}
	}
}

// Rank servers at base+r bind their own HTTP ports: those are checked
// with the derived ones (a port taken at base+1 once failed a test).
func TestFreeRankServersPortChecksRankHTTPPorts(t *testing.T) {
	got, err := discoveryPortOffsets(3, true, DefaultEventPortOffset, DefaultReplayPortOffset)
	must(t, err)
	want := []int{0, 10000, 30000, 10001, 30001, 1, 10002, 30002, 2}
	if !slices.Equal(got, want) {
		t.Fatalf("rank servers' offsets %v, want %v", got, want)
	}
	if got, err = discoveryPortOffsets(3, false, DefaultEventPortOffset, DefaultReplayPortOffset); err != nil || slices.Contains(got, 1) {
		t.Fatalf("one engine's offsets %v (%v) include a rank's HTTP port", got, err)
	}
	if _, err := discoveryPortOffsets(2, true, 1, 100); err == nil {
		t.Fatal("rank 0's events on rank 1's HTTP port accepted")
	}
	base, err := FreeRankServersPort(2, DefaultEventPortOffset, DefaultReplayPortOffset)
	must(t, err)
	for _, p := range []int{base, base + 1, base + 10000, base + 10001, base + 30000, base + 30001} {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("port %d of base %d is not free: %v", p, base, err)
		}
		l.Close()
	}
}

// R-DISC-2: with DiscoveryOffsets one Config gives an engine whose KV
// endpoints are exactly where kvcar's discovery looks for them.
func TestDiscoveryOffsetsRDISC2(t *testing.T) {
	e := startEngine(t, Config{DPSize: 2, DiscoveryOffsets: DefaultDiscoveryOffsets()})
	_, portStr, err := net.SplitHostPort(e.HTTPAddr())
	must(t, err)
	port, err := strconv.Atoi(portStr)
	must(t, err)
	for dp := range 2 {
		if got, want := e.EventEndpoint(dp), fmt.Sprintf("tcp://127.0.0.1:%d", port+DefaultEventPortOffset+dp); got != want {
			t.Fatalf("dp %d events %s, want %s", dp, got, want)
		}
		if got, want := e.ReplayEndpoint(dp), fmt.Sprintf("tcp://127.0.0.1:%d", port+DefaultReplayPortOffset+dp); got != want {
			t.Fatalf("dp %d replay %s, want %s", dp, got, want)
		}
	}
	wantHealth(t, e.HTTPAddr(), http.StatusOK)
	p := newPeer(t, e, 1)
	_, _, err = e.Prefill(1, tokens(0, testBS))
	must(t, err)
	if m := p.liveOK(); m.batch.DPRank != 1 {
		t.Fatalf("live batch from rank %d", m.batch.DPRank)
	}

	if _, err := New(Config{DiscoveryOffsets: DefaultDiscoveryOffsets(), EventEndpoints: []string{AnyPort}}); err == nil {
		t.Fatal("DiscoveryOffsets with explicit endpoints accepted")
	}
}
