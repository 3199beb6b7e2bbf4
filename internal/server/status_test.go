package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/instance"
	"github.com/kvcar/kvcar/internal/kvdir"
)

// fixedStreams is a StreamLister over a fixed list.
type fixedStreams []kvdir.StreamStatus

func (f fixedStreams) Streams() []kvdir.StreamStatus { return f }

// fixedRegistry is an InstanceLister over a fixed snapshot.
type fixedRegistry struct{ snap *instance.Snapshot }

func (f fixedRegistry) Snapshot() *instance.Snapshot { return f.snap }

// hostile is a value an engine could register under; the page must show
// it as text.
const hostile = `<script>alert("x")</script>&`

func statusFixture() Options {
	now := time.Now()
	return Options{
		Streams: fixedStreams{
			{InstanceName: "10.0.0.1:8000", DPRank: 0, Endpoint: "tcp://10.0.0.1:18000", ReplayEndpoint: "tcp://10.0.0.1:38000",
				Incarnation: "inc-a", Synchronized: true, SyncMode: "live", Sequence: 41, DeviceBlocks: 1200, HostBlocks: 800,
				BatchesApplied: 40, EventsApplied: 90, SnapshotsStarted: 2, SnapshotsOK: 2,
				LastSnapshot: 12500 * time.Microsecond, LastEventAge: 1500 * time.Millisecond},
			{InstanceName: hostile, DPRank: 1, Error: "sequence gap: expected 7, got 10 <b>", Gaps: 1, SnapshotsStarted: 3,
				SnapshotsFailed: 2, BufferedBytes: 3 << 20},
		},
		Instances: fixedRegistry{&instance.Snapshot{Synced: true, Version: 9, Instances: []instance.Instance{
			{Meta: instance.Meta{Name: "10.0.0.1:8000", IncarnationID: "inc-a", DPSize: 1}, Type: instance.Default, Role: instance.Default,
				State: instance.Active, StateSince: now.Add(-time.Minute), HasLoad: true, LoadValid: true,
				Load: instance.Load{WaitingRequests: 3, GPUCacheUsagePerc: 0.25}, LoadSource: instance.LoadHeartbeat,
				LastHeartbeat: now.Add(-200 * time.Millisecond)},
			{Meta: instance.Meta{Name: "10.0.0.2:8000", DPSize: 2}, Type: instance.Mix, Role: instance.Decode,
				State: instance.LeaseLost, StateSince: now},
		}}},
		Policy:   "CAR",
		IsMaster: func() bool { return true },
	}
}

// TestStreamsAndInstancesJSON checks the fields of both operator JSON
// routes, the null "last" durations, and the disabled case.
func TestStreamsAndInstancesJSON(t *testing.T) {
	ts := startServer(t, statusFixture(), true)
	resp, body := do(t, ts, "GET", StreamsPath, nil)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("streams: %d %s", resp.StatusCode, body)
	}
	var got struct {
		Streams      []map[string]any `json:"streams"`
		IndexEnabled bool             `json:"index_enabled"`
	}
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	if !got.IndexEnabled || len(got.Streams) != 2 {
		t.Fatalf("streams: %s", body)
	}
	want := []string{"instance_name", "dp_rank", "endpoint", "replay_endpoint", "incarnation", "sync_mode", "topic",
		"synchronized", "complete", "sequence", "error", "device_blocks", "host_blocks", "batches_applied", "events_applied",
		"decode_errors", "gaps", "disconnects", "snapshots_started", "snapshots_succeeded", "snapshots_failed",
		"partial_starts", "tail_repairs", "buffered_bytes", "last_snapshot_ms", "last_event_age_ms"}
	for _, st := range got.Streams {
		if len(st) != len(want) {
			t.Errorf("stream has %d fields, want %d: %v", len(st), len(want), st)
		}
		for _, k := range want {
			if _, ok := st[k]; !ok {
				t.Errorf("stream lacks %q: %v", k, st)
			}
		}
	}
	a, b := got.Streams[0], got.Streams[1]
	if a["synchronized"] != true || a["sequence"] != 41.0 || a["device_blocks"] != 1200.0 || a["snapshots_succeeded"] != 2.0 ||
		a["last_snapshot_ms"] != 12.5 || a["last_event_age_ms"] != 1500.0 || a["error"] != "" {
		t.Errorf("stream 0: %v", a)
	}
	if b["instance_name"] != hostile || b["synchronized"] != false || b["gaps"] != 1.0 || b["snapshots_failed"] != 2.0 ||
		b["last_snapshot_ms"] != nil || b["last_event_age_ms"] != nil || b["buffered_bytes"] != float64(3<<20) {
		t.Errorf("stream 1: %v", b)
	}

	resp, body = do(t, ts, "GET", InstancesPath, nil)
	var inst struct {
		Instances       []map[string]any `json:"instances"`
		RegistryEnabled bool             `json:"registry_enabled"`
		Synced          bool             `json:"synced"`
		Version         uint64           `json:"version"`
		IsMaster        bool             `json:"is_master"`
	}
	if err := json.Unmarshal(body, &inst); resp.StatusCode != 200 || err != nil {
		t.Fatalf("instances: %d %s %v", resp.StatusCode, body, err)
	}
	if !inst.RegistryEnabled || !inst.Synced || inst.Version != 9 || !inst.IsMaster || len(inst.Instances) != 2 {
		t.Fatalf("instances: %s", body)
	}
	i0, i1 := inst.Instances[0], inst.Instances[1]
	if i0["name"] != "10.0.0.1:8000" || i0["type"] != "DEFAULT" || i0["state"] != "ACTIVE" || i0["has_load"] != true ||
		i0["waiting"] != 3.0 || i0["gpu_cache_usage_perc"] != 0.25 || i0["load_source"] != "heartbeat" ||
		i0["incarnation"] != "inc-a" || i0["last_heartbeat_age_ms"] == nil {
		t.Errorf("instance 0: %v", i0)
	}
	if i1["type"] != "MIX" || i1["role"] != "DECODE" || i1["state"] != "LEASE_LOST" || i1["has_load"] != false ||
		i1["dp_size"] != 2.0 || i1["last_heartbeat_age_ms"] != nil {
		t.Errorf("instance 1: %v", i1)
	}

	// Nothing wired: both answer, with empty lists rather than null.
	bare := startServer(t, Options{}, true)
	if _, body := do(t, bare, "GET", StreamsPath, nil); string(body) != `{"streams":[],"index_enabled":false}`+"\n" {
		t.Errorf("disabled streams: %s", body)
	}
	if _, body := do(t, bare, "GET", InstancesPath, nil); string(body) != `{"instances":[],"registry_enabled":false,"synced":false,"version":0,"is_master":false}`+"\n" {
		t.Errorf("no registry: %s", body)
	}
}

// TestOperatorRoutesAuthAndReadiness: the JSON routes follow the query
// API (R-API-1, R-API-2): header token only, 503 before ready; the page
// also takes ?token= and is rendered before ready, with 503.
func TestOperatorRoutesAuthAndReadiness(t *testing.T) {
	opts := statusFixture()
	opts.InternalAPIToken = "s3cret"
	ts := startServer(t, opts, true)
	for _, path := range []string{StreamsPath, InstancesPath} {
		resp, body := do(t, ts, "GET", path, nil)
		checkError(t, resp, body, 401, "missing X-Internal-Token")
		resp, body = do(t, ts, "GET", path, nil, withHeader("X-Internal-Token", "s3cre"))
		checkError(t, resp, body, 401, "invalid X-Internal-Token")
		// The query parameter is for browsers on the page only.
		resp, body = do(t, ts, "GET", path+"?token=s3cret", nil)
		checkError(t, resp, body, 401, "missing X-Internal-Token")
		if resp, body := do(t, ts, "GET", path, nil, withHeader("X-Internal-Token", "s3cret")); resp.StatusCode != 200 {
			t.Errorf("%s with token: %d %s", path, resp.StatusCode, body)
		}
		resp, body = do(t, ts, "POST", path, nil, withHeader("X-Internal-Token", "s3cret"))
		checkError(t, resp, body, 405, "use GET")
	}

	for _, tc := range []struct {
		name  string
		query string
		hdr   string
		code  int
	}{
		{"nothing", "", "", 401},
		{"wrong query", "?token=nope", "", 401},
		{"repeated query", "?token=s3cret&token=s3cret", "", 401},
		{"query", "?token=s3cret", "", 200},
		{"header", "", "s3cret", 200},
		// A header, when sent, decides: a good query does not rescue it.
		{"wrong header, good query", "?token=s3cret", "nope", 401},
	} {
		var ro []reqOpt
		if tc.hdr != "" {
			ro = append(ro, withHeader("X-Internal-Token", tc.hdr))
		}
		resp, body := do(t, ts, "GET", StatusPagePath+tc.query, nil, ro...)
		if resp.StatusCode != tc.code {
			t.Errorf("page, %s: %d %s", tc.name, resp.StatusCode, body)
		}
		if tc.code == 200 && !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
			t.Errorf("page, %s: Content-Type %q", tc.name, resp.Header.Get("Content-Type"))
		}
	}

	notReady := startServer(t, opts, false)
	for _, path := range []string{StreamsPath, InstancesPath} {
		resp, body := do(t, notReady, "GET", path, nil, withHeader("X-Internal-Token", "s3cret"))
		checkError(t, resp, body, 503, "not ready")
		if resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s: no Retry-After", path)
		}
	}
	resp, body := do(t, notReady, "GET", StatusPagePath+"?token=s3cret", nil)
	if resp.StatusCode != 503 || !strings.Contains(string(body), "not ready") || !strings.Contains(string(body), "10.0.0.1:8000") {
		t.Errorf("page before ready: %d %s", resp.StatusCode, body)
	}
}

// TestStatusPage checks what the page shows and that everything from
// engines and etcd is escaped.
func TestStatusPage(t *testing.T) {
	ts := startServer(t, statusFixture(), true)
	resp, body := do(t, ts, "GET", StatusPagePath, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	for k, v := range map[string]string{
		"Content-Security-Policy": "default-src 'none'",
		"Referrer-Policy":         "no-referrer",
		"Cache-Control":           "no-store",
		"X-Frame-Options":         "DENY",
	} {
		if !strings.Contains(resp.Header.Get(k), v) {
			t.Errorf("%s = %q, want %q", k, resp.Header.Get(k), v)
		}
	}
	page := string(body)
	for _, want := range []string{
		`<meta http-equiv="refresh" content="5">`,
		`policy<b>CAR</b>`, `<span class="badge ok">master</span>`, `<span class="badge ok">ready</span>`,
		`1 of 2 streams synchronised`, `2 instances`,
		`10.0.0.1:8000 <b>dp 0</b>`, `<span class="badge ok">synchronised</span><span class="reason">live · partial view</span>`,
		`<span class="badge bad">unsynchronised</span><span class="reason">sequence gap: expected 7, got 10 &lt;b&gt;</span>`,
		`&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&amp;`,
		`1.5 s ago`, `12 ms`, `3.0 MiB`, `<td class="num">1200 / 800</td>`, `title="incarnation inc-a"`,
		`<span class="badge ok">ACTIVE</span>`, `<span class="badge warn">LEASE_LOST</span>`,
		`<td class="num">25.0%</td>`, `heartbeat`, `no report yet`, `ms ago`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	if strings.Contains(page, "<script") {
		t.Error("an instance name reached the page unescaped")
	}

	// Replica, index disabled, no registry: the page still renders and
	// says so.
	bare := startServer(t, Options{IsMaster: func() bool { return false }}, true)
	_, body = do(t, bare, "GET", StatusPagePath, nil)
	for _, want := range []string{`<span class="badge off">replica</span>`, `KV index is disabled`, `No instance registry`, `policy<b>none</b>`} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("bare page lacks %s", want)
		}
	}
}

// TestRootRedirect: / leads to the page with its query (so ?token= still
// works), while unknown paths stay 404.
func TestRootRedirect(t *testing.T) {
	ts := startServer(t, Options{}, true)
	client := ts.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := client.Get(ts.URL + "/?token=abc")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != StatusPagePath+"?token=abc" {
		t.Errorf("/: %d Location %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	if resp, body := do(t, ts, "GET", "/nothing-here", nil); resp.StatusCode != 404 {
		t.Errorf("/nothing-here: %d %s", resp.StatusCode, body)
	}
}

func TestHumanFormats(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Second:              "0 µs",
		750 * time.Microsecond:    "750 µs",
		850 * time.Millisecond:    "850 ms",
		4213 * time.Millisecond:   "4.2 s",
		125 * time.Second:         "2m 05s",
		3*time.Hour + time.Minute: "3h 01m",
		75 * time.Hour:            "3d 03h",
	} {
		if got := humanDuration(d); got != want {
			t.Errorf("humanDuration(%v) = %q, want %q", d, got, want)
		}
	}
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 5 << 30: "5.0 GiB"} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestPprofBehindToken checks that the profiler is served only with the
// internal token.
func TestPprofBehindToken(t *testing.T) {
	srv := httptest.NewServer(New(Options{InternalAPIToken: "tok"}).InternalHandler())
	defer srv.Close()
	for _, tc := range []struct {
		token string
		code  int
	}{{"", http.StatusUnauthorized}, {"bad", http.StatusUnauthorized}, {"tok", http.StatusOK}} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/debug/pprof/", nil)
		if tc.token != "" {
			req.Header.Set("X-Internal-Token", tc.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.code {
			t.Errorf("token %q: %d, want %d", tc.token, resp.StatusCode, tc.code)
		}
	}
}
