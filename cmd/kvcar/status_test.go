package main

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"image"
	"image/png"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/enginesim"
)

const statusToken = "st4tus-t0ken"

// Colours of the page's badges (statuspage.html): the screenshot check
// looks for them.
var (
	badgeSynchronised   = [3]uint8{0x1a, 0x7f, 0x37}
	badgeUnsynchronised = [3]uint8{0xcf, 0x22, 0x2e}
)

type streamsAnswer struct {
	IndexEnabled bool           `json:"index_enabled"`
	Streams      []streamStatus `json:"streams"`
}

type streamStatus struct {
	InstanceName       string   `json:"instance_name"`
	DPRank             int      `json:"dp_rank"`
	Endpoint           string   `json:"endpoint"`
	ReplayEndpoint     string   `json:"replay_endpoint"`
	Incarnation        string   `json:"incarnation"`
	Synchronized       bool     `json:"synchronized"`
	Sequence           uint64   `json:"sequence"`
	Error              string   `json:"error"`
	DeviceBlocks       int      `json:"device_blocks"`
	HostBlocks         int      `json:"host_blocks"`
	BatchesApplied     uint64   `json:"batches_applied"`
	EventsApplied      uint64   `json:"events_applied"`
	DecodeErrors       uint64   `json:"decode_errors"`
	Gaps               uint64   `json:"gaps"`
	SnapshotsStarted   uint64   `json:"snapshots_started"`
	SnapshotsSucceeded uint64   `json:"snapshots_succeeded"`
	SnapshotsFailed    uint64   `json:"snapshots_failed"`
	BufferedBytes      int64    `json:"buffered_bytes"`
	LastSnapshotMs     *float64 `json:"last_snapshot_ms"`
	LastEventAgeMs     *float64 `json:"last_event_age_ms"`
}

type instancesAnswer struct {
	RegistryEnabled bool `json:"registry_enabled"`
	Synced          bool `json:"synced"`
	IsMaster        bool `json:"is_master"`
	Instances       []struct {
		Name               string   `json:"name"`
		Type               string   `json:"type"`
		Role               string   `json:"role"`
		State              string   `json:"state"`
		Incarnation        string   `json:"incarnation"`
		DPSize             int      `json:"dp_size"`
		HasLoad            bool     `json:"has_load"`
		LoadValid          bool     `json:"load_valid"`
		GPUCacheUsagePerc  float64  `json:"gpu_cache_usage_perc"`
		LoadSource         string   `json:"load_source"`
		LastHeartbeatAgeMs *float64 `json:"last_heartbeat_age_ms"`
	} `json:"instances"`
}

// get fetches path from kvcar, with the token header when not empty.
func get(t *testing.T, addr, path, token string) (int, string) {
	t.Helper()
	resp, b := send(t, http.MethodGet, "http://"+addr+path, token, "")
	return resp.StatusCode, string(b)
}

func getJSON(t *testing.T, addr, path string, v any) {
	t.Helper()
	code, body := get(t, addr, path, statusToken)
	if code != http.StatusOK {
		t.Fatalf("%s: %d %s", path, code, body)
	}
	if err := json.Unmarshal([]byte(body), v); err != nil {
		t.Fatalf("%s: %s: %v", path, body, err)
	}
}

// startSecuredCluster is startCluster with --internal_api_token set, so
// engines send the token with their heartbeats and every internal read
// carries it; dpSizes gives each engine's DP ranks.
func startSecuredCluster(t *testing.T, dpSizes []int, flags ...string) *cluster {
	t.Helper()
	c := &cluster{etcd: startEtcd(t)}
	cfg := writeConfig(t, `{"discovery":{"enabled":true,"block_size":16,"topic":"xllm-kv","refresh_interval_ms":50}}`)
	addrs := startKVCar(t, append([]string{"--etcd_addr=" + strings.Join(c.etcd.Endpoints(), ","), "--advertise_host=127.0.0.1",
		"--kv_events_config_file=" + cfg, "--internal_api_token=" + statusToken}, flags...)...)
	c.addr, c.internal = addrs.public, addrs.internal
	streams := 0
	for _, dp := range dpSizes {
		e, err := enginesim.New(enginesim.Config{
			DPSize: dp, BlockSize: 16, DeviceBlocks: 256, HostBlocks: 64, Topic: "xllm-kv", TimeScale: 0.001,
			DiscoveryOffsets: enginesim.DefaultDiscoveryOffsets(),
			Etcd:             &enginesim.EtcdConfig{Endpoints: c.etcd.Endpoints(), Type: enginesim.TypeDefault, LeaseTTL: time.Second},
			Heartbeat:        &enginesim.HeartbeatConfig{Interval: 50 * time.Millisecond, Token: statusToken},
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		c.engines = append(c.engines, e)
		streams += dp
	}
	for _, e := range c.engines {
		waitUntil(t, "heartbeat accepted", 10*time.Second, func() bool { return e.LastHeartbeatStatus() == http.StatusOK })
	}
	waitUntil(t, "all streams synchronised", 10*time.Second, func() bool {
		_, body := get(t, c.internal, "/v1/internal/kv-cache/streams", statusToken)
		return strings.Count(body, `"synchronized":true`) == streams
	})
	return c
}

func blockTokens(from, blocks int) []uint32 {
	ids := make([]uint32, blocks*16)
	for i := range ids {
		ids[i] = uint32(from + i)
	}
	return ids
}

// TestStatusEndToEnd runs kvcar with discovery, token and emulated
// engines and checks the operator routes against what the engines did:
// stream and instance fields, the token rules of R-API-2 (and the page's
// ?token=), the page's badges, and a sequence gap reported with its
// reason on both the JSON route and the page.
func TestStatusEndToEnd(t *testing.T) {
	c := startSecuredCluster(t, []int{1, 2}, "--load_balance_policy=CAR")
	a, b := c.engines[0], c.engines[1]
	if _, _, err := a.Prefill(0, blockTokens(100, 3)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Prefill(1, blockTokens(500, 2)); err != nil {
		t.Fatal(err)
	}
	var st streamsAnswer
	waitUntil(t, "prefills applied", 10*time.Second, func() bool {
		st = streamsAnswer{}
		getJSON(t, c.internal, "/v1/internal/kv-cache/streams", &st)
		return len(st.Streams) == 3 && st.Streams[0].DeviceBlocks+st.Streams[1].DeviceBlocks+st.Streams[2].DeviceBlocks == 5
	})
	if !st.IndexEnabled {
		t.Fatal("index_enabled false")
	}
	type key struct {
		name string
		dp   int
	}
	want := map[key]struct {
		e      *enginesim.Engine
		blocks int
	}{{a.Name(), 0}: {a, 3}, {b.Name(), 0}: {b, 0}, {b.Name(), 1}: {b, 2}}
	for _, s := range st.Streams {
		w, ok := want[key{s.InstanceName, s.DPRank}]
		if !ok {
			t.Fatalf("unexpected stream %s dp %d", s.InstanceName, s.DPRank)
		}
		if s.Endpoint != w.e.EventEndpoint(s.DPRank) || s.ReplayEndpoint != w.e.ReplayEndpoint(s.DPRank) ||
			s.Incarnation != w.e.IncarnationID() || !s.Synchronized || s.Error != "" || s.DeviceBlocks != w.blocks ||
			s.SnapshotsStarted < 1 || s.SnapshotsSucceeded < 1 || s.SnapshotsFailed != 0 || s.Gaps != 0 || s.DecodeErrors != 0 ||
			s.LastSnapshotMs == nil || *s.LastSnapshotMs <= 0 || s.BufferedBytes != 0 {
			t.Errorf("stream %s dp %d = %+v", s.InstanceName, s.DPRank, s)
		}
		// Only a rank that published has applied events; they may have
		// come with its snapshot rather than as live batches, but a lag is
		// reported exactly when a live batch was applied.
		applied := w.blocks > 0
		if applied != (s.EventsApplied > 0) || (s.LastEventAgeMs != nil) != (s.BatchesApplied > 0) {
			t.Errorf("stream %s dp %d: live counters %+v after %d blocks", s.InstanceName, s.DPRank, s, w.blocks)
		}
		if next := w.e.Seq(s.DPRank); applied && s.Sequence+1 != next {
			t.Errorf("stream %s dp %d: sequence %d, engine's next is %d", s.InstanceName, s.DPRank, s.Sequence, next)
		}
	}

	var inst instancesAnswer
	getJSON(t, c.internal, "/v1/internal/instances", &inst)
	if !inst.RegistryEnabled || !inst.Synced || !inst.IsMaster || len(inst.Instances) != 2 {
		t.Fatalf("instances: %+v", inst)
	}
	for _, in := range inst.Instances {
		e := a
		if in.Name == b.Name() {
			e = b
		}
		if in.Name != e.Name() || in.Type != "DEFAULT" || in.Role != "DEFAULT" || in.State != "ACTIVE" || in.DPSize != e.DPSize() ||
			in.Incarnation != e.IncarnationID() || !in.HasLoad || !in.LoadValid || in.LoadSource != "heartbeat" ||
			in.LastHeartbeatAgeMs == nil || *in.LastHeartbeatAgeMs > 5000 {
			t.Errorf("instance %+v", in)
		}
	}

	// R-API-2 on the operator routes, and ?token= for the page only.
	for _, path := range []string{"/v1/internal/kv-cache/streams", "/v1/internal/instances", "/debug/kvcar"} {
		if code, body := get(t, c.internal, path, ""); code != http.StatusUnauthorized || !strings.Contains(body, `"error"`) {
			t.Errorf("%s without token: %d %s", path, code, body)
		}
		if code, body := get(t, c.internal, path, "wrong"); code != http.StatusUnauthorized {
			t.Errorf("%s with a wrong token: %d %s", path, code, body)
		}
		if code, body := get(t, c.internal, path, statusToken); code != http.StatusOK {
			t.Errorf("%s with the header: %d %s", path, code, body)
		}
	}
	if code, _ := get(t, c.internal, "/v1/internal/kv-cache/streams?token="+statusToken, ""); code != http.StatusUnauthorized {
		t.Errorf("streams took ?token=: %d", code)
	}
	if code, _ := get(t, c.internal, "/debug/kvcar?token=wrong", ""); code != http.StatusUnauthorized {
		t.Errorf("page took a wrong ?token=: %d", code)
	}
	code, page := get(t, c.internal, "/debug/kvcar?token="+statusToken, "")
	if code != http.StatusOK {
		t.Fatalf("page with ?token=: %d %s", code, page)
	}
	for _, want := range []string{a.Name() + " <b>dp 0</b>", b.Name() + " <b>dp 1</b>", "policy<b>CAR</b>",
		`<span class="badge ok">master</span>`, "3 of 3 streams synchronised", "2 instances", `<span class="badge ok">ACTIVE</span>`} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	if n := strings.Count(page, `<span class="badge ok">synchronised</span>`); n != 3 {
		t.Errorf("%d synchronised badges, want 3", n)
	}

	// A gap: the stream has applied a live message, so it expects the
	// next sequence; the engine skips three and answers no snapshot, so
	// the stream stays unsynchronised with a reason.
	if err := a.SetReplayMode(0, enginesim.ReplayIgnore); err != nil {
		t.Fatal(err)
	}
	if err := a.SkipSeq(0, 3); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Prefill(0, blockTokens(900, 1)); err != nil {
		t.Fatal(err)
	}
	var reason string
	var last streamStatus
	defer func() {
		if t.Failed() {
			t.Logf("last status of the faulty stream: %+v\npage:\n%s", last, page)
		}
	}()
	waitUntil(t, "gap reported on the JSON route and the page", 10*time.Second, func() bool {
		st = streamsAnswer{}
		getJSON(t, c.internal, "/v1/internal/kv-cache/streams", &st)
		i := slices.IndexFunc(st.Streams, func(s streamStatus) bool { return s.InstanceName == a.Name() })
		if i < 0 {
			t.Fatalf("stream of %s gone: %+v", a.Name(), st)
		}
		s := st.Streams[i]
		last = s
		if s.Synchronized || s.Gaps != 1 || s.Error == "" || s.DeviceBlocks != 0 || s.HostBlocks != 0 {
			return false
		}
		reason = s.Error
		_, page = get(t, c.internal, "/debug/kvcar", statusToken)
		return strings.Contains(page, `<span class="badge bad">unsynchronised</span><span class="reason">`+html.EscapeString(reason)+`</span>`)
	})
	if !strings.Contains(page, "2 of 3 streams synchronised") || strings.Count(page, `<span class="badge ok">synchronised</span>`) != 2 {
		t.Errorf("page after the gap (reason %q):\n%s", reason, page)
	}
	t.Logf("unsynchronised stream reason: %s", reason)

	t.Run("screenshot", func(t *testing.T) { checkScreenshot(t, c.internal) })
}

// chromium finds the browser, skipping the test where it is absent except
// in CI, where scripts/deps.sh test (make test) installs it.
func chromium(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/chromium", "chromium"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium not installed in CI: scripts/deps.sh test (make test) installs it")
	}
	t.Skip("chromium not installed: apt-get install chromium")
	return ""
}

// checkScreenshot renders the status page in headless Chromium and checks
// that the image is a real page: right size, not blank, with both badge
// colours. KVCAR_STATUS_SCREENSHOT=<file> keeps a copy for a person to
// look at.
func checkScreenshot(t *testing.T, addr string) {
	bin := chromium(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "status.png")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
		"--force-color-profile=srgb", "--user-data-dir="+filepath.Join(dir, "profile"), "--window-size=1280,900",
		"--screenshot="+out, "http://"+addr+"/debug/kvcar?token="+statusToken)
	// Chromium forks helpers; its own process group lets a timeout end
	// all of them, not only the first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	output, err := cmd.CombinedOutput()
	if cmd.Process != nil {
		// Helpers that outlive a clean exit are ended too; ESRCH is the
		// normal answer.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if err != nil {
		t.Fatalf("chromium: %v\n%s", err, output)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatalf("no screenshot: %v\n%s", err, output)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if keep := os.Getenv("KVCAR_STATUS_SCREENSHOT"); keep != "" {
		if err := copyFile(out, keep); err != nil {
			t.Errorf("keeping the screenshot: %v", err)
		}
		t.Logf("screenshot kept at %s", keep)
	}
	if sz := img.Bounds().Size(); sz != (image.Point{1280, 900}) {
		t.Errorf("screenshot is %v, want 1280x900", sz)
	}
	st := pixelStats(img)
	total := img.Bounds().Dx() * img.Bounds().Dy()
	t.Logf("screenshot: %d colours, %d of %d pixels not white, %d synchronised-badge and %d unsynchronised-badge pixels",
		st.colours, st.nonWhite, total, st.near[badgeSynchronised], st.near[badgeUnsynchronised])
	if st.colours < 32 || st.nonWhite < total/50 {
		t.Errorf("screenshot looks blank: %d colours, %d non-white pixels", st.colours, st.nonWhite)
	}
	// A badge is about 90x18 pixels of solid colour; two synchronised
	// and one unsynchronised stream are shown.
	if st.near[badgeSynchronised] < 1000 {
		t.Errorf("synchronised badge colour %x: %d pixels", badgeSynchronised, st.near[badgeSynchronised])
	}
	if st.near[badgeUnsynchronised] < 500 {
		t.Errorf("unsynchronised badge colour %x: %d pixels", badgeUnsynchronised, st.near[badgeUnsynchronised])
	}
}

type imageStats struct {
	colours, nonWhite int
	near              map[[3]uint8]int
}

// pixelStats counts distinct colours, non-white pixels and the pixels
// within a small distance of each badge colour (text anti-aliasing and
// rounding in the compositor shift a few values).
func pixelStats(img image.Image) imageStats {
	st := imageStats{near: map[[3]uint8]int{}}
	seen := map[uint32]bool{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			p := [3]uint8{uint8(r >> 8), uint8(g >> 8), uint8(bl >> 8)}
			seen[uint32(p[0])<<16|uint32(p[1])<<8|uint32(p[2])] = true
			if p != [3]uint8{0xff, 0xff, 0xff} {
				st.nonWhite++
			}
			for _, c := range [][3]uint8{badgeSynchronised, badgeUnsynchronised} {
				if closeColour(p, c) {
					st.near[c]++
				}
			}
		}
	}
	st.colours = len(seen)
	return st
}

func closeColour(a, b [3]uint8) bool {
	for i := range a {
		if d := int(a[i]) - int(b[i]); d < -6 || d > 6 {
			return false
		}
	}
	return true
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return fmt.Errorf("read %s: %w", from, err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", to, err)
	}
	return nil
}
