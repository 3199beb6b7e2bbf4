package server

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/instance"
	"github.com/kvcar/kvcar/internal/testlog"
)

// Issue 10 item 2: a heartbeat with a load or latency out of range gets
// 400 naming the field, and the instance keeps its last good load.
func TestHeartbeatOutOfRangeRefused(t *testing.T) {
	reg, names := heartbeatRegistry(t, 1)
	ts := startServer(t, Options{Heartbeats: reg}, true)
	name := names[0]
	good := `{"name":"` + name + `","incarnation_id":"inc","load_metrics":{"waiting_requests_num":4,"gpu_cache_usage_perc":0.25}}`
	if resp, body := do(t, ts, http.MethodPost, HeartbeatPath, strings.NewReader(good)); resp.StatusCode != http.StatusOK {
		t.Fatalf("good heartbeat: %d %s", resp.StatusCode, body)
	}
	want := instance.Load{WaitingRequests: 4, GPUCacheUsagePerc: 0.25}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := reg.WaitFor(ctx, func(s *instance.Snapshot) bool { in, _ := s.Lookup(name); return in.Load == want }); err != nil {
		t.Fatal(err)
	}
	before, _ := reg.Lookup(name)

	for _, tc := range []struct{ fields, field string }{
		{`"load_metrics":{"waiting_requests_num":0,"gpu_cache_usage_perc":"NaN"}`, "load_metrics.gpu_cache_usage_perc"},
		{`"load_metrics":{"waiting_requests_num":0,"gpu_cache_usage_perc":"Infinity"}`, "load_metrics.gpu_cache_usage_perc"},
		{`"loadMetrics":{"gpuCacheUsagePerc":"-Infinity"}`, "load_metrics.gpu_cache_usage_perc"},
		{`"load_metrics":{"waiting_requests_num":0,"gpu_cache_usage_perc":-0.5}`, "load_metrics.gpu_cache_usage_perc"},
		{`"load_metrics":{"waiting_requests_num":0,"gpu_cache_usage_perc":1.5}`, "load_metrics.gpu_cache_usage_perc"},
		{`"latency_metrics":{"recent_max_ttft":-1,"recent_max_tbt":5}`, "latency_metrics.recent_max_ttft"},
		{`"latency_metrics":{"recent_max_ttft":1,"recent_max_tbt":"-5"}`, "latency_metrics.recent_max_tbt"},
	} {
		body := `{"name":"` + name + `","incarnation_id":"inc",` + tc.fields + `}`
		resp, got := do(t, ts, http.MethodPost, HeartbeatPath, strings.NewReader(body))
		checkError(t, resp, got, http.StatusBadRequest, tc.field)
	}
	// Every refusal was synchronous, so a change would be visible now
	// or after the deferred publication at the latest.
	time.Sleep(2 * instance.DefaultLoadPublishDelay)
	after, _ := reg.Lookup(name)
	if !after.LoadUsable() || after.Load != want || !after.LastHeartbeat.Equal(before.LastHeartbeat) || after.HasLatency {
		t.Fatalf("refused heartbeats changed the instance: before %+v, after %+v", before, after)
	}
}

// Issue 10 item 6: the 409 body neither tells an unknown instance from
// a stale incarnation nor shows the registered incarnation id; the log
// keeps the detail, at Debug.
func TestHeartbeatConflictIsGeneric(t *testing.T) {
	reg, names := heartbeatRegistry(t, 1)
	var logs testlog.Buffer
	ts := startServer(t, Options{Heartbeats: reg, Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}, true)

	unknown := `{"name":"10.9.9.9:1","incarnation_id":"inc"}`
	stale := `{"name":"` + names[0] + `","incarnation_id":"someone-else"}`
	respU, bodyU := do(t, ts, http.MethodPost, HeartbeatPath, strings.NewReader(unknown))
	respS, bodyS := do(t, ts, http.MethodPost, HeartbeatPath, strings.NewReader(stale))
	checkError(t, respU, bodyU, http.StatusConflict, heartbeatConflict)
	checkError(t, respS, bodyS, http.StatusConflict, heartbeatConflict)
	if !bytes.Equal(bodyU, bodyS) {
		t.Errorf("unknown and stale answered differently:\n%s\n%s", bodyU, bodyS)
	}
	// The registered incarnation is "inc"; the engine must not learn it.
	for _, leak := range []string{`"inc"`, "inc\"", "incarnation_id", "unknown", "stale", names[0]} {
		if bytes.Contains(bodyS, []byte(leak)) || bytes.Contains(bodyU, []byte(leak)) {
			t.Errorf("409 body shows %q: %s / %s", leak, bodyU, bodyS)
		}
	}
	log := logs.String()
	for _, want := range []string{"unknown instance", "stale incarnation", `registered \"inc\"`, "10.9.9.9:1"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
}
