package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvcar/kvcar/internal/etcdembed"
	"github.com/kvcar/kvcar/internal/instance"
)

// heartbeatRegistry runs a real registry on an embedded etcd with n
// registered DEFAULT instances, and returns it with their names.
func heartbeatRegistry(tb testing.TB, n int) (*instance.Registry, []string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := etcdembed.Start(ctx, etcdembed.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { srv.Close() })
	cfg, err := instance.ClientConfig(srv.Endpoints(), func(string) string { return "" }, nil)
	if err != nil {
		tb.Fatal(err)
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cli.Close() })
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250+1)
		v := fmt.Sprintf(`{"name":%q,"rpc_address":"10.0.0.1:9000","type":0,"incarnation_id":"inc","dp_size":1}`, names[i])
		if _, err := cli.Put(ctx, "XLLM:DEFAULT:"+names[i], v); err != nil {
			tb.Fatal(err)
		}
	}
	reg, err := instance.New(instance.Options{Client: cli, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		tb.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		reg.Run(rctx)
	}()
	tb.Cleanup(func() {
		rcancel()
		<-done
	})
	if err := reg.WaitFor(ctx, func(s *instance.Snapshot) bool { return len(s.Instances) == n }); err != nil {
		tb.Fatal(err)
	}
	return reg, names
}

// heartbeatBody is an engine's HeartbeatRequest as xLLM sends it.
func heartbeatBody(name string, i int) []byte {
	return fmt.Appendf(nil, `{"name":%q,"incarnation_id":"inc","load_metrics":{"waiting_requests_num":%d,"gpu_cache_usage_perc":%g},"latency_metrics":{"recent_max_ttft":%d,"recent_max_tbt":%d}}`,
		name, i%7, float64(i%100)/100, 100+i%50, 20+i%10)
}

// R-CAR-10: a heartbeat through the HTTP route reaches the registry,
// whose snapshot carries its load soon after.
func TestHeartbeatReachesRegistry(t *testing.T) {
	reg, names := heartbeatRegistry(t, 2)
	ts := startServer(t, Options{Heartbeats: reg}, true)
	resp, body := do(t, ts, http.MethodPost, HeartbeatPath, bytes.NewReader(heartbeatBody(names[1], 3)))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("heartbeat: %d %s", resp.StatusCode, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := reg.WaitFor(ctx, func(s *instance.Snapshot) bool {
		in, _ := s.Lookup(names[1])
		return in.LoadUsable() && in.Load == instance.Load{WaitingRequests: 3, GPUCacheUsagePerc: 0.03} &&
			in.Latency == instance.Latency{RecentMaxTTFT: 103, RecentMaxTBT: 23}
	})
	if err != nil {
		in, _ := reg.Lookup(names[1])
		t.Fatalf("load of the heartbeat not in the snapshot: %v; instance %+v", err, in)
	}
	resp, body = do(t, ts, http.MethodPost, HeartbeatPath, bytes.NewReader(heartbeatBody("10.9.9.9:1", 0)))
	checkError(t, resp, body, http.StatusConflict, heartbeatConflict)
}

// The body is read whole up to its limit, whether or not the client
// declares its length: a larger one gets 413, a malformed one 400, and
// neither reaches the registry.
func TestHeartbeatBodyLimits(t *testing.T) {
	reg, names := heartbeatRegistry(t, 1)
	ts := startServer(t, Options{Heartbeats: reg}, true)

	// Over the limit inside a valid object, sent without a length.
	big := append([]byte(`{"name":"`+names[0]+`","cache_event":"`), bytes.Repeat([]byte("x"), maxHeartbeatBytes)...)
	big = append(big, `"}`...)
	req, err := http.NewRequest(http.MethodPost, ts.URL+HeartbeatPath, struct{ io.Reader }{bytes.NewReader(big)})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	checkError(t, resp, body, http.StatusRequestEntityTooLarge, "exceeds")

	// Just under it, with a declared length: accepted, the deprecated
	// cache_event ignored.
	fit := append([]byte(`{"name":"`+names[0]+`","incarnation_id":"inc","cache_event":"`), bytes.Repeat([]byte("x"), maxHeartbeatBytes-200)...)
	fit = append(fit, `"}`...)
	resp, body = do(t, ts, http.MethodPost, HeartbeatPath, bytes.NewReader(fit))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("heartbeat of %d bytes: %d %s", len(fit), resp.StatusCode, body)
	}

	resp, body = do(t, ts, http.MethodPost, HeartbeatPath, strings.NewReader(`{"name":"`+names[0]+`","load_metrics":[]}`))
	checkError(t, resp, body, http.StatusBadRequest, "load_metrics: want a JSON object")
	if in, _ := reg.Lookup(names[0]); in.HasLoad {
		t.Errorf("a rejected heartbeat's load was applied: %+v", in)
	}
}

// BenchmarkHeartbeatIntake measures the whole intake of one heartbeat
// at 128 registered engines, in process: routing, body read, parse and
// the registry, without the network.
func BenchmarkHeartbeatIntake(b *testing.B) {
	reg, names := heartbeatRegistry(b, 128)
	h := New(Options{Heartbeats: reg}).InternalHandler()
	bodies := make([][]byte, 1024)
	for i := range bodies {
		bodies[i] = heartbeatBody(names[i%len(names)], i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		req := httptest.NewRequest(http.MethodPost, HeartbeatPath, bytes.NewReader(bodies[i%len(bodies)]))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			b.Fatalf("heartbeat: %d %s", w.Code, w.Body)
		}
		i++
	}
}
