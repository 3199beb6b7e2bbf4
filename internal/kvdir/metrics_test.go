package kvdir

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/kvevent"
)

// series returns the gathered samples of one metric family whose labels
// contain every given name=value pair.
func series(t *testing.T, reg *prometheus.Registry, name string, labels ...string) []*dto.Metric {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []*dto.Metric
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			out = append(out, m)
		}
	}
	return out
}

func value(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	ms := series(t, reg, name, labels...)
	if len(ms) != 1 {
		t.Fatalf("%s%v: %d series", name, labels, len(ms))
	}
	m := ms[0]
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	t.Fatalf("%s: unexpected metric type", name)
	return 0
}

// TestMetrics checks the per-stream series against what the stream did:
// synchronisation, resident blocks per tier, events by type, snapshot
// results and durations, live event lag, the calibration drift a
// silently lost removal produces (R-REC-4), and the directory's count of
// walks that took a shared table's lock.
func TestMetrics(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 64, HostBlocks: 64})
	lim := testLimits()
	lim.ResyncInterval = 200 * time.Millisecond
	reg := prometheus.NewRegistry()
	d, err := New(lim, Options{Logger: testLogger(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.SetStreams([]StreamSpec{specOf(e, 0)}); err != nil {
		t.Fatal(err)
	}
	k := StreamKey{e.Name(), 0}
	waitSynced(t, d, k, 0)
	hashes, err := e.StoreChain(0, seqTokens(1, 4*testBlock), kvevent.Device)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.StoreChain(0, seqTokens(1, 2*testBlock), kvevent.Host); err != nil {
		t.Fatal(err)
	}
	if err := e.Remove(0, hashes[3:], kvevent.Device); err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, d, e, 0)
	l := []string{"instance", e.Name(), "dp_rank", "0"}
	if v := value(t, reg, "kvcar_stream_synchronized", l...); v != 1 {
		t.Errorf("synchronized = %v", v)
	}
	if v := value(t, reg, "kvcar_stream_resident_blocks", append(l, "tier", "device")...); v != 3 {
		t.Errorf("device blocks = %v", v)
	}
	if v := value(t, reg, "kvcar_stream_resident_blocks", append(l, "tier", "host")...); v != 2 {
		t.Errorf("host blocks = %v", v)
	}
	if v := value(t, reg, "kvcar_stream_events_applied_total", append(l, "type", "BlockStored")...); v != 2 {
		t.Errorf("BlockStored events = %v", v)
	}
	if v := value(t, reg, "kvcar_stream_events_applied_total", append(l, "type", "BlockRemoved")...); v != 1 {
		t.Errorf("BlockRemoved events = %v", v)
	}
	if v := value(t, reg, "kvcar_stream_snapshots_total", append(l, "result", "succeeded")...); v < 1 {
		t.Errorf("snapshots succeeded = %v", v)
	}
	if v := value(t, reg, "kvcar_stream_snapshot_duration_seconds", l...); v < 1 {
		t.Errorf("snapshot durations observed = %v", v)
	}
	if v := value(t, reg, "kvcar_stream_event_lag_seconds", l...); v != 3 {
		t.Errorf("event lags observed = %v, want one per live batch", v)
	}

	// A removal the engine never publishes is drift the next calibration
	// finds and counts.
	if err := e.SetDropTail(0, true); err != nil {
		t.Fatal(err)
	}
	if err := e.Remove(0, hashes[:1], kvevent.Device); err != nil {
		t.Fatal(err)
	}
	eventually(t, "calibration counts the lost removal", 10*time.Second, func() (bool, string) {
		v := value(t, reg, "kvcar_stream_calibration_blocks_total", append(l, "change", "removed")...)
		return v == 1, fmt.Sprintf("removed=%v", v)
	})
	if v := value(t, reg, "kvcar_stream_calibration_blocks_total", append(l, "change", "added")...); v != 0 {
		t.Errorf("calibration added = %v", v)
	}

	// A query that meets a write under way without walks to share it
	// with waits for it, then walks under the table's lock: counted.
	if v := value(t, reg, "kvcar_directory_locked_walks_total"); v != 0 {
		t.Errorf("locked walks before any contention = %v", v)
	}
	prompt := seqTokens(1, 4*testBlock)
	want := d.Query(prompt, nil)
	tab := d.set.Load().tables[0]
	tab.mu.Lock()
	tab.beginWrite()
	done := make(chan []Match)
	go func() { done <- d.Query(prompt, nil) }()
	time.Sleep(20 * time.Millisecond)
	tab.endWrite()
	tab.mu.Unlock()
	if m := <-done; len(m) != 1 || m[0] != want[0] || m[0].ReusablePrefixTokens == 0 {
		t.Errorf("the query that waited for the write answered %+v, want %+v", m, want)
	}
	if v := value(t, reg, "kvcar_directory_locked_walks_total"); v != 1 {
		t.Errorf("locked walks = %v, want 1", v)
	}

	// Retiring the stream drops its series; the directory's count of
	// locked walks outlives the table.
	if err := d.SetStreams(nil); err != nil {
		t.Fatal(err)
	}
	if v := value(t, reg, "kvcar_directory_locked_walks_total"); v != 1 {
		t.Errorf("locked walks after the table went = %v, want 1", v)
	}
	if n := len(series(t, reg, "kvcar_stream_event_lag_seconds", l...)); n != 0 {
		t.Errorf("%d lag series left after the stream was retired", n)
	}
	if v := value(t, reg, "kvcar_streams"); v != 0 {
		t.Errorf("kvcar_streams = %v", v)
	}
}

// TestLagIgnoresTimestampsThatAreNotTimes: a live batch whose timestamp
// is no time (NaN, infinite, 0 or less) is not observed in
// kvcar_stream_event_lag_seconds, whose sum a single NaN would spoil for
// good; a real one still is.
func TestLagIgnoresTimestampsThatAreNotTimes(t *testing.T) {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "lag", Buckets: []float64{.1, 1, 10}})
	o := &streamObservers{lag: h}
	now := time.Now()
	for _, ts := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), 0, -5} {
		o.observeLag(ts, now)
	}
	o.observeLag(float64(now.Add(-2*time.Second).UnixNano())/1e9, now)
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	if n, sum := m.Histogram.GetSampleCount(), m.Histogram.GetSampleSum(); n != 1 || math.IsNaN(sum) || sum < 1.9 || sum > 2.1 {
		t.Errorf("%d lags observed, sum %v; want the one real timestamp's 2 s", n, sum)
	}
}
