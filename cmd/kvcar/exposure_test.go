package main

// Exposure: every route on every listener of the real command over real
// TCP, what a client can send to steer routing, and what start-up
// refuses (R-API-5: a bad config fails at start-up naming the key and
// its range).

import (
	"context"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/enginesim"
)

const testToken = "r3view-t0ken"

type request struct {
	method, url string
	header      http.Header
	body        string
}

func doRequest(t *testing.T, rq request) (int, http.Header, string) {
	t.Helper()
	var rd io.Reader
	if rq.body != "" {
		rd = strings.NewReader(rq.body)
	}
	req, err := http.NewRequest(rq.method, rq.url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range rq.header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if rq.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	c := &http.Client{Timeout: 5 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", rq.method, rq.url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

// TestExposureRouteMatrix runs the command with a token from a
// file and tries every route on both listeners with no token, an empty
// one, a wrong one, two values, the token in the query string and the
// right one.
func TestExposureRouteMatrix(t *testing.T) {
	tokFile := writeConfig(t, testToken+"\n")
	addrs := startKVCar(t, "--internal_api_token_file="+tokFile)
	pub, in := "http://"+addrs.public, "http://"+addrs.internal

	hb := `{"name":"127.0.0.1:9","incarnation_id":"x","load_metrics":{"waiting_requests_num":1,"gpu_cache_usage_perc":0.1}}`
	internal := []struct{ method, path, body string }{
		{"POST", "/v1/internal/heartbeat", hb},
		{"POST", "/v1/internal/kv-cache/query", `{"token_ids":[]}`},
		{"GET", "/v1/internal/kv-cache/streams", ""},
		{"GET", "/v1/internal/instances", ""},
		{"GET", "/debug/kvcar", ""},
		{"GET", "/metrics", ""},
		{"HEAD", "/metrics", ""},
		{"GET", "/debug/pprof/", ""},
		{"GET", "/debug/pprof/heap", ""},
		{"GET", "/debug/pprof/goroutine?debug=2", ""},
		{"GET", "/debug/pprof/cmdline", ""},
		{"GET", "/debug/pprof/symbol", ""},
		{"GET", "/debug/pprof/profile?seconds=1", ""},
		{"GET", "/debug/pprof/trace?seconds=1", ""},
		{"HEAD", "/debug/kvcar", ""},
	}
	for _, rt := range internal {
		// Public listener: never served, whatever the token.
		for _, h := range []http.Header{nil, hdr("X-Internal-Token", testToken)} {
			if code, _, body := doRequest(t, request{rt.method, pub + rt.path, h, rt.body}); code != http.StatusNotFound {
				t.Errorf("public %s %s: %d %s, want 404", rt.method, rt.path, code, body)
			}
		}
		// Internal listener: every refusal is 401.
		for name, h := range map[string]http.Header{
			"no token":          nil,
			"empty token":       hdr("X-Internal-Token", ""),
			"wrong token":       hdr("X-Internal-Token", testToken+"x"),
			"prefix of token":   hdr("X-Internal-Token", testToken[:5]),
			"two values":        hdr("X-Internal-Token", "bad", "X-Internal-Token", testToken),
			"two values (good)": hdr("X-Internal-Token", testToken, "X-Internal-Token", "bad"),
			"empty bearer":      hdr("Authorization", "Bearer "),
			"basic scheme":      hdr("Authorization", "Basic "+testToken),
		} {
			if code, _, body := doRequest(t, request{rt.method, in + rt.path, h, rt.body}); code != http.StatusUnauthorized {
				t.Errorf("internal %s %s with %s: %d %.200s, want 401", rt.method, rt.path, name, code, body)
			}
		}
		// The token in the query string counts only for the status page.
		sep := "?"
		if strings.Contains(rt.path, "?") {
			sep = "&"
		}
		code, _, body := doRequest(t, request{rt.method, in + rt.path + sep + "token=" + testToken, nil, rt.body})
		if wantOK := rt.path == "/debug/kvcar"; (code == http.StatusUnauthorized) == wantOK {
			t.Errorf("internal %s %s?token=: %d %.200s (query token accepted: %v, want %v)", rt.method, rt.path, code, body,
				code != http.StatusUnauthorized, wantOK)
		}
		// Bearer counts only for /metrics.
		code, _, body = doRequest(t, request{rt.method, in + rt.path, hdr("Authorization", "Bearer "+testToken), rt.body})
		if wantOK := strings.HasPrefix(rt.path, "/metrics"); (code == http.StatusUnauthorized) == wantOK {
			t.Errorf("internal %s %s with bearer: %d %.200s", rt.method, rt.path, code, body)
		}
		// The right token opens it.
		code, _, body = doRequest(t, request{rt.method, in + rt.path, hdr("X-Internal-Token", testToken), rt.body})
		if code == http.StatusUnauthorized || code == http.StatusNotFound || code >= 500 {
			t.Errorf("internal %s %s with the token: %d %.200s", rt.method, rt.path, code, body)
		}
	}
	// Open on both: /health and /ready; the internal root redirects
	// (without revealing anything) to the status page.
	for _, base := range []string{pub, in} {
		for _, p := range []string{"/health", "/ready"} {
			if code, _, body := doRequest(t, request{"GET", base + p, nil, ""}); code != http.StatusOK {
				t.Errorf("%s%s: %d %s", base, p, code, body)
			}
		}
	}
	if code, h, _ := doRequest(t, request{"GET", in + "/", nil, ""}); code != http.StatusFound || h.Get("Location") != "/debug/kvcar" {
		t.Errorf("internal /: %d %v", code, h)
	}
	// The public 404s name the internal listener.
	code, _, body := doRequest(t, request{"GET", pub + "/v1/internal/instances", nil, ""})
	if code != http.StatusNotFound || !strings.Contains(body, "internal listener") {
		t.Errorf("public /v1/internal/instances: %d %s", code, body)
	}
}

// TestExposureMethodErrorsNameTheMethod: a wrong method on an internal
// route, /metrics and /debug/pprof/* included, gets kvcar's JSON error
// naming the method and the allowed ones.
func TestExposureMethodErrorsNameTheMethod(t *testing.T) {
	addrs := startKVCar(t, "--internal_api_token="+testToken)
	for _, p := range []string{"/v1/internal/instances", "/metrics", "/debug/pprof/heap"} {
		code, h, body := doRequest(t, request{"POST", "http://" + addrs.internal + p, hdr("X-Internal-Token", testToken), ""})
		if code != http.StatusMethodNotAllowed || !strings.HasPrefix(h.Get("Content-Type"), "application/json") ||
			!strings.Contains(body, "method POST not allowed") {
			t.Errorf("POST %s: %d %s %q, want 405 with kvcar's JSON error naming the method", p, code, h.Get("Content-Type"), body)
		}
	}
}

// TestExposureTokenEnvNewlineOnlyRefused: a token variable holding only
// a line ending is given, and empty once the line ending is dropped: it
// is refused, naming the variable, as an empty token file is, rather
// than leaving the internal API without a token.
func TestExposureTokenEnvNewlineOnlyRefused(t *testing.T) {
	t.Setenv(tokenEnv, "\n")
	log, err := startAndStop(t)
	if err == nil || !strings.Contains(err.Error(), tokenEnv) {
		t.Errorf("%s=\"\\n\": start-up error %v, want a refusal naming %s (kvcar started with no token)\n%s", tokenEnv, err, tokenEnv, log)
	}
}

// TestExposureEtcdAddrMalformedRefused: an --etcd_addr endpoint no dial
// can ever use (no port, too many colons, a port past 65535) stops
// start-up naming the flag, where kvcar once started and stayed unready
// for ever.
func TestExposureEtcdAddrMalformedRefused(t *testing.T) {
	for _, a := range []string{"127.0.0.1", "not-a-host::::", "10.0.0.5:99999"} {
		_, err := startAndStop(t, "--etcd_addr="+a, "--log_level=error")
		if err == nil || !strings.Contains(err.Error(), "--etcd_addr") {
			t.Errorf("--etcd_addr=%s: start-up error %v, want a refusal naming --etcd_addr", a, err)
		}
	}
}

// TestExposurePolicyFlagsRefusedWhateverPolicy: --car_prefill_lambda,
// --car_host_hit_weight, --target_ttft and --target_tpot are checked
// whatever the policy, as every other flag is.
func TestExposurePolicyFlagsRefusedWhateverPolicy(t *testing.T) {
	for _, a := range []string{"--car_prefill_lambda=7", "--car_host_hit_weight=-1", "--target_ttft=-5", "--target_tpot=-1"} {
		name := strings.SplitN(a, "=", 2)[0]
		_, err := startAndStop(t, "--load_balance_policy=RR", a, "--log_level=error")
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("RR with %s: start-up error %v, want a refusal naming %s", a, err, name)
		}
	}
}

// TestExposureAdvertiseHostNamesFlag: a bad --advertise_host is refused
// naming the flag, before anything starts.
func TestExposureAdvertiseHostNamesFlag(t *testing.T) {
	_, err := startAndStop(t, "--advertise_host=bad host!", "--log_level=error")
	if err == nil || !strings.Contains(err.Error(), "--advertise_host") {
		t.Errorf("--advertise_host=\"bad host!\": %v, want a refusal naming --advertise_host", err)
	}
}

// TestExposureProfileSecondsBounded: a profile's or trace's ?seconds=
// past maxProfileSeconds is refused with a 400 naming the limit: the
// internal server has no write timeout, which net/http/pprof checks it
// against, and one request could hold the process's only CPU profiler
// for a day.
func TestExposureProfileSecondsBounded(t *testing.T) {
	addrs := startKVCar(t, "--internal_api_token="+testToken)
	for _, p := range []string{"/debug/pprof/profile?seconds=86400", "/debug/pprof/trace?seconds=86400"} {
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+addrs.internal+p, nil)
		req.Header.Set("X-Internal-Token", testToken)
		resp, err := http.DefaultClient.Do(req)
		switch {
		case err != nil:
			t.Errorf("GET %s: no answer within 1.5 s (%v): the request holds the profiler for as long as it asked", p, err)
		case resp.StatusCode != http.StatusBadRequest:
			t.Errorf("GET %s: %d (accepted: it runs for as long as asked), want 400 naming the limit", p, resp.StatusCode)
		}
		if resp != nil {
			resp.Body.Close()
		}
		cancel()
	}
}

// TestExposureREADMEHeartbeatPort: README's engine table sends the vLLM
// sidecar's heartbeats where kvcar takes them, the internal port: the
// public port answers 404 there.
func TestExposureREADMEHeartbeatPort(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "| heartbeats |") && strings.Contains(line, "--http_server_port") {
			t.Errorf("README: %s", line)
		}
	}
}

// TestExposureClientCannotOverrideRouting: what a client sends
// beside its prompt (X-Prefill-Name / X-Decode-Name headers, a routing
// member spelt with escapes or nested, query parameters) never changes
// the engine a request goes to nor the routing names the engine sees,
// for a vLLM engine (HTTP relay) and an xLLM engine (baidu_std).
func TestExposureClientCannotOverrideRouting(t *testing.T) {
	f := startFleet(t, "--load_balance_policy=RR")
	a := f.engine(t, enginesim.TypeDefault, true, nil)
	b := f.engine(t, enginesim.TypeDefault, true, nil)
	x := f.engine(t, enginesim.TypeDefault, false, nil)
	names := map[string]bool{a.Name(): true, b.Name(): true, x.Name(): true}
	forged := "10.9.9.9:1"
	fr := `{"prefill_name":"` + forged + `","decode_name":"` + forged + `"}`
	bodies := []struct{ path, body string }{
		{"/v1/completions", `{"max_tokens":2,"prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`},
		{"/v1/completions", `{"max_tokens":2,"rout\u0069ng":` + fr + `,"prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`},
		{"/v1/completions", `{"max_tokens":2,"\u0072outing":` + fr + `,"prompt":"hello"}`},
		{"/v1/chat/completions", `{"max_tokens":2,"routing":` + fr + `,"messages":[{"role":"user","content":"hi","routing":` + fr + `}]}`},
	}
	seen := map[string]int{}
	for i := 0; i < 3; i++ {
		for _, bd := range bodies {
			code, h, body := doRequest(t, request{"POST", "http://" + f.addr + bd.path + "?prefill_name=" + forged + "&routing=" + forged,
				hdr("X-Prefill-Name", forged, "X-Decode-Name", forged, "X-Kvcar-Policy", "CAR"), bd.body})
			if code != http.StatusOK {
				t.Fatalf("%s %s: %d %s", bd.path, bd.body, code, body)
			}
			if p := h.Get("X-Prefill-Name"); !names[p] {
				t.Errorf("%s: routed to %q", bd.body, p)
			}
			seen[h.Get("X-Prefill-Name")]++
			eu, ok := engineReport([]byte(body), f.engines)
			if !ok || eu.PrefillName != eu.Instance || eu.DecodeName != "" || eu.Instance != h.Get("X-Prefill-Name") {
				t.Errorf("%s: engine %q saw routing %q/%q, kvcar said %q (%s)", bd.body, eu.Instance, eu.PrefillName, eu.DecodeName,
					h.Get("X-Prefill-Name"), body)
			}
		}
	}
	if len(seen) != 3 {
		t.Errorf("RR reached %v, want all three engines", seen)
	}
	// A routing member given twice, once escaped, is refused rather than
	// left for the engine to pick one.
	code, _, body := doRequest(t, request{"POST", "http://" + f.addr + "/v1/completions", nil,
		`{"routing":{},"rout\u0069ng":` + fr + `,"prompt":[1]}`})
	if code != http.StatusBadRequest || !strings.Contains(body, "routing: given more than once") {
		t.Errorf("two routing members: %d %s", code, body)
	}
	for _, e := range f.engines {
		if st := e.Stats(); st.Misrouted != 0 {
			t.Errorf("engine %s: %d misrouted", e.Name(), st.Misrouted)
		}
	}
}

// TestExposureFlagRanges: out-of-range sizes, timeouts, counts and
// ports stop start-up naming the flag and its range.
func TestExposureFlagRanges(t *testing.T) {
	for _, a := range []string{
		"--max_request_body_bytes=-1", "--max_request_body_bytes=0", "--max_request_body_bytes=9223372036854775807",
		"--max_inflight_request_bytes=-5", "--max_prompt_text_bytes=-1",
		"--rpc_max_inflight_bytes=0", "--rpc_max_inflight_bytes=1099511627777",
		"--rpc_max_queued_output_bytes=-1",
		"--http_server_port=-1", "--http_server_port=65536", "--internal_port=70000", "--rpc_server_port=-2",
		"--lease_lost_heartbeat_timeout_ms=0", "--detect_disconnected_instance_interval=0",
		"--instance_delete_probe_timeout_ms=0", "--instance_delete_probe_attempts=0", "--instance_delete_probe_attempts=1000",
		"--car_dispatch_max_age_ms=0", "--car_max_pending_dispatches=-1", "--car_pending_prefix_timeout_ms=0",
		"--car_max_pending_blocks=99999999", "--car_keep_warm_interval_us=-1", "--car_dispatch_heartbeat_lag_ms=-1",
	} {
		name := strings.SplitN(a, "=", 2)[0]
		_, err := parseFlags([]string{a}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "must be in [") {
			t.Errorf("%s: %v, want a refusal naming %s and its range", a, err, name)
		}
	}
	for _, a := range []string{"--car_dispatch_token_weight=NaN", "--car_dispatch_token_weight=1.5"} {
		if _, err := parseFlags([]string{a}, io.Discard); err == nil || !strings.Contains(err.Error(), "[0, 1]") {
			t.Errorf("%s: %v", a, err)
		}
	}
	// Loopback needs no token; anything else does, and an empty token
	// source is refused, not taken as "no token".
	for _, args := range [][]string{
		{"--internal_host="},
		{"--internal_host=::"},
		{"--internal_api_token_file=" + writeConfig(t, "\n"), "--internal_host=127.0.0.1"},
		{"--internal_api_token=two words"},
	} {
		if _, err := startAndStop(t, append(args, "--log_level=error")...); err == nil {
			t.Errorf("%q started", args)
		}
	}
}
