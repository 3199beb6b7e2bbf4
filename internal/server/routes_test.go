package server

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestInternalRoutesOnlyOnInternalHandler: heartbeat intake, the query
// API, the operator routes, the status page, the profiler and /metrics are
// not served by the public handler at all, with or without a token (issue
// 10 item 2: anyone who could send a completion could read profiles, list
// instances and forge heartbeats); the request path is not served by the
// internal one; /health and /ready are on both.
func TestInternalRoutesOnlyOnInternalHandler(t *testing.T) {
	s := New(Options{Metrics: prometheus.NewRegistry()})
	s.SetReady(true)
	public := httptest.NewServer(s.Handler())
	defer public.Close()
	internal := httptest.NewServer(s.InternalHandler())
	defer internal.Close()

	internalRoutes := []struct{ method, path, body string }{
		{http.MethodPost, HeartbeatPath, `{"name":"127.0.0.1:1"}`},
		{http.MethodPost, QueryPath, `{"token_ids":[]}`},
		{http.MethodGet, StreamsPath, ""},
		{http.MethodGet, InstancesPath, ""},
		{http.MethodGet, StatusPagePath, ""},
		{http.MethodGet, "/debug/pprof/", ""},
		{http.MethodGet, "/debug/pprof/cmdline", ""},
		{http.MethodGet, "/metrics", ""},
	}
	for _, rt := range internalRoutes {
		resp, body := do(t, public, rt.method, rt.path, strings.NewReader(rt.body))
		checkError(t, resp, body, http.StatusNotFound, "internal listener")
		resp, body = do(t, internal, rt.method, rt.path, strings.NewReader(rt.body))
		if resp.StatusCode == http.StatusNotFound {
			t.Errorf("internal %s %s: 404 %s", rt.method, rt.path, body)
		}
	}
	if resp, _ := do(t, public, http.MethodGet, "/", nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("public /: %d, want 404 (the status page redirect is internal)", resp.StatusCode)
	}
	for _, rt := range []struct{ method, path string }{
		{http.MethodPost, CompletionsPath}, {http.MethodPost, ChatCompletionsPath}, {http.MethodGet, ModelsPath},
	} {
		if resp, _ := do(t, public, rt.method, rt.path, strings.NewReader(`{}`)); resp.StatusCode == http.StatusNotFound {
			t.Errorf("public %s %s: 404", rt.method, rt.path)
		}
		if resp, _ := do(t, internal, rt.method, rt.path, strings.NewReader(`{}`)); resp.StatusCode != http.StatusNotFound {
			t.Errorf("internal %s %s: %d, want 404", rt.method, rt.path, resp.StatusCode)
		}
	}
	for _, ts := range []*httptest.Server{public, internal} {
		for _, p := range []string{"/health", "/ready"} {
			if resp, body := do(t, ts, http.MethodGet, p, nil); resp.StatusCode != http.StatusOK {
				t.Errorf("%s: %d %s", p, resp.StatusCode, body)
			}
		}
	}
}

// TestMetricsBehindToken: with a token set, /metrics needs it, as
// X-Internal-Token or as the bearer token a Prometheus scrape job sends.
func TestMetricsBehindToken(t *testing.T) {
	ts := startServer(t, Options{InternalAPIToken: "tok", Metrics: prometheus.NewRegistry()}, true)
	for _, tc := range []struct {
		header, value string
		code          int
		want          string
	}{
		{"", "", http.StatusUnauthorized, "missing"},
		{"X-Internal-Token", "bad", http.StatusUnauthorized, "invalid X-Internal-Token"},
		{"Authorization", "Bearer bad", http.StatusUnauthorized, "invalid Authorization"},
		{"Authorization", "Basic tok", http.StatusUnauthorized, "invalid Authorization"},
		{"Authorization", "tok", http.StatusUnauthorized, "invalid Authorization"},
		{"X-Internal-Token", "tok", http.StatusOK, ""},
		{"Authorization", "Bearer tok", http.StatusOK, ""},
		{"Authorization", "bearer tok", http.StatusOK, ""},
	} {
		var opts []reqOpt
		if tc.header != "" {
			opts = append(opts, withHeader(tc.header, tc.value))
		}
		resp, body := do(t, ts, http.MethodGet, "/metrics", nil, opts...)
		if tc.code != http.StatusOK {
			checkError(t, resp, body, tc.code, tc.want)
			continue
		}
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "kvcar_http_requests_total") {
			t.Errorf("%s: %q: %d %.200s", tc.header, tc.value, resp.StatusCode, body)
		}
	}
	// A bearer token elsewhere is not the internal token's header.
	resp, body := do(t, ts, http.MethodGet, StreamsPath, nil, withHeader("Authorization", "Bearer tok"))
	checkError(t, resp, body, http.StatusUnauthorized, "X-Internal-Token")
}
