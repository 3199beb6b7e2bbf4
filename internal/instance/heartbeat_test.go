package instance

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestParseHeartbeat(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		want Heartbeat
	}{
		{"proto names", `{"name":"127.0.0.1:8000","incarnation_id":"i","load_metrics":{"waiting_requests_num":3,"gpu_cache_usage_perc":0.25},"latency_metrics":{"recent_max_ttft":120,"recent_max_tbt":30}}`,
			Heartbeat{Name: "127.0.0.1:8000", IncarnationID: "i", Load: &Load{3, 0.25}, Latency: &Latency{120, 30}}},
		{"lowerCamelCase and 64-bit ints as strings", `{"name":"n","incarnationId":"i","loadMetrics":{"waitingRequestsNum":"18446744073709551615","gpuCacheUsagePerc":"0.5"},"latencyMetrics":{"recentMaxTtft":"-1","recentMaxTbt":"9223372036854775807"}}`,
			Heartbeat{Name: "n", IncarnationID: "i", Load: &Load{math.MaxUint64, 0.5}, Latency: &Latency{-1, math.MaxInt64}}},
		// R-CAR-11: the deprecated cache_event is accepted and ignored,
		// whatever it holds.
		{"cache_event ignored", `{"name":"n","cache_event":{"stored_cache":["AAEC"],"removed_cache":[]}}`,
			Heartbeat{Name: "n"}},
		{"cacheEvent of any type ignored", `{"name":"n","cacheEvent":7}`,
			Heartbeat{Name: "n"}},
		{"absent and null messages", `{"name":"n","load_metrics":null,"latency_metrics":null,"incarnation_id":null}`,
			Heartbeat{Name: "n"}},
		{"empty messages are zero reports", `{"name":"n","load_metrics":{},"latency_metrics":{}}`,
			Heartbeat{Name: "n", Load: &Load{}, Latency: &Latency{}}},
		{"unknown members ignored", `{"name":"n","future":{"x":[1,2]},"load_metrics":{"waiting_requests_num":1e2,"gpu_cache_usage_perc":1,"extra":true}}`,
			Heartbeat{Name: "n", Load: &Load{100, 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseHeartbeat([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if got.Name != tc.want.Name || got.IncarnationID != tc.want.IncarnationID {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
			if (got.Load == nil) != (tc.want.Load == nil) || got.Load != nil && *got.Load != *tc.want.Load {
				t.Errorf("load %+v, want %+v", got.Load, tc.want.Load)
			}
			if (got.Latency == nil) != (tc.want.Latency == nil) || got.Latency != nil && *got.Latency != *tc.want.Latency {
				t.Errorf("latency %+v, want %+v", got.Latency, tc.want.Latency)
			}
		})
	}
}

// Non-finite usage is representable in proto-JSON; it parses, and
// Validate refuses it.
func TestParseHeartbeatNonFinite(t *testing.T) {
	for body, check := range map[string]func(float64) bool{
		`{"name":"n","load_metrics":{"gpu_cache_usage_perc":"NaN"}}`:       math.IsNaN,
		`{"name":"n","load_metrics":{"gpu_cache_usage_perc":"Infinity"}}`:  func(f float64) bool { return math.IsInf(f, 1) },
		`{"name":"n","load_metrics":{"gpu_cache_usage_perc":"-Infinity"}}`: func(f float64) bool { return math.IsInf(f, -1) },
	} {
		hb, err := ParseHeartbeat([]byte(body))
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if !check(hb.Load.GPUCacheUsagePerc) || validLoad(*hb.Load) {
			t.Errorf("%s: usage %v valid %v", body, hb.Load.GPUCacheUsagePerc, validLoad(*hb.Load))
		}
		if err := hb.Validate(); !errors.Is(err, ErrInvalidHeartbeat) {
			t.Errorf("%s: Validate = %v, want ErrInvalidHeartbeat", body, err)
		}
	}
}

// Issue 10 item 2: every value out of its field's range is refused,
// and the error names the field; values at the edges of the ranges
// pass.
func TestHeartbeatValidate(t *testing.T) {
	load := func(u float64) *Load { return &Load{WaitingRequests: 1, GPUCacheUsagePerc: u} }
	for _, tc := range []struct {
		name  string
		hb    Heartbeat
		field string // "" when valid
	}{
		{"no reports", Heartbeat{Name: "n"}, ""},
		{"usage 0", Heartbeat{Name: "n", Load: load(0)}, ""},
		{"usage 1", Heartbeat{Name: "n", Load: load(1)}, ""},
		{"usage 0.5 and latencies", Heartbeat{Name: "n", Load: load(0.5), Latency: &Latency{0, math.MaxInt64}}, ""},
		{"most waiting", Heartbeat{Name: "n", Load: &Load{WaitingRequests: math.MaxUint64}}, ""},
		{"usage NaN", Heartbeat{Name: "n", Load: load(math.NaN())}, "load_metrics.gpu_cache_usage_perc"},
		{"usage +Inf", Heartbeat{Name: "n", Load: load(math.Inf(1))}, "load_metrics.gpu_cache_usage_perc"},
		{"usage -Inf", Heartbeat{Name: "n", Load: load(math.Inf(-1))}, "load_metrics.gpu_cache_usage_perc"},
		{"usage negative", Heartbeat{Name: "n", Load: load(-0.01)}, "load_metrics.gpu_cache_usage_perc"},
		{"usage negative zero is zero", Heartbeat{Name: "n", Load: load(math.Copysign(0, -1))}, ""},
		{"usage above 1", Heartbeat{Name: "n", Load: load(1.01)}, "load_metrics.gpu_cache_usage_perc"},
		{"usage a percentage", Heartbeat{Name: "n", Load: load(85)}, "load_metrics.gpu_cache_usage_perc"},
		{"ttft negative", Heartbeat{Name: "n", Latency: &Latency{RecentMaxTTFT: -1}}, "latency_metrics.recent_max_ttft"},
		{"tbt negative", Heartbeat{Name: "n", Latency: &Latency{RecentMaxTBT: math.MinInt64}}, "latency_metrics.recent_max_tbt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.hb.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate(%+v) = %v", tc.hb, err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidHeartbeat) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("Validate = %v, want ErrInvalidHeartbeat naming %s", err, tc.field)
			}
		})
	}
}

func TestParseHeartbeatErrors(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{``, "heartbeat"},
		{`[]`, "want a JSON object"},
		{`{"name":"n"} {}`, "data after the object"},
		{`{"name":"n"`, "heartbeat"},
		{`{}`, "name missing"},
		{`{"name":""}`, "name missing"},
		{`{"name":5}`, "name: want a string"},
		{`{"name":"n","incarnation_id":1}`, "incarnation_id: want a string"},
		{`{"name":"n","load_metrics":[]}`, "load_metrics: want a JSON object"},
		{`{"name":"n","load_metrics":{"waiting_requests_num":-1}}`, "load_metrics.waiting_requests_num: want a non-negative"},
		{`{"name":"n","load_metrics":{"waiting_requests_num":1.5}}`, "load_metrics.waiting_requests_num"},
		{`{"name":"n","load_metrics":{"waiting_requests_num":"18446744073709551616"}}`, "load_metrics.waiting_requests_num"},
		{`{"name":"n","load_metrics":{"waiting_requests_num":true}}`, "load_metrics.waiting_requests_num"},
		{`{"name":"n","load_metrics":{"gpu_cache_usage_perc":"lots"}}`, "load_metrics.gpu_cache_usage_perc: want a number"},
		{`{"name":"n","load_metrics":{"gpu_cache_usage_perc":{}}}`, "load_metrics.gpu_cache_usage_perc"},
		{`{"name":"n","latency_metrics":{"recent_max_ttft":"9223372036854775808"}}`, "latency_metrics.recent_max_ttft"},
		{`{"name":"n","latency_metrics":{"recentMaxTbt":0.5}}`, "latency_metrics.recent_max_tbt"},
		{`{"name":"n","name":"m"}`, "name given twice"},
		{`{"name":"n","loadMetrics":{},"load_metrics":{}}`, "load_metrics given twice"},
		{`{"name":"n","load_metrics":{"waiting_requests_num":1,"waitingRequestsNum":2}}`, "load_metrics.waiting_requests_num given twice"},
	} {
		_, err := ParseHeartbeat([]byte(tc.body))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseHeartbeat(%s) = %v, want an error with %q", tc.body, err, tc.want)
		}
	}
}

func TestLowerCamel(t *testing.T) {
	for in, want := range map[string]string{
		"name": "name", "waiting_requests_num": "waitingRequestsNum", "recent_max_ttft": "recentMaxTtft", "incarnation_id": "incarnationId",
	} {
		if got := lowerCamel(in); got != want {
			t.Errorf("lowerCamel(%q) = %q, want %q", in, got, want)
		}
	}
}
