package server

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestNotReadyReason: until the service is ready, /ready, the query API
// and the status page say what it waits for (R-API-1; issue 10 item 8).
func TestNotReadyReason(t *testing.T) {
	s := New(Options{})
	s.SetNotReady("waiting for the first listing of etcd")
	public := httptest.NewServer(s.Handler())
	defer public.Close()
	internal := httptest.NewServer(s.InternalHandler())
	defer internal.Close()

	resp, body := do(t, public, http.MethodGet, "/ready", nil)
	checkError(t, resp, body, http.StatusServiceUnavailable, "not ready: waiting for the first listing of etcd")
	resp, body = query(t, internal, `{"token_ids":[]}`)
	checkError(t, resp, body, http.StatusServiceUnavailable, "waiting for the first listing of etcd")
	resp, body = do(t, internal, http.MethodGet, StatusPagePath, nil)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "waiting for the first listing of etcd") {
		t.Errorf("status page before ready: %d, want 503 with the reason\n%s", resp.StatusCode, body)
	}

	s.SetReady(true)
	if resp, body := do(t, public, http.MethodGet, "/ready", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("/ready once ready: %d %s", resp.StatusCode, body)
	}
	if resp, body := query(t, internal, `{"token_ids":[]}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("query once ready: %d %s", resp.StatusCode, body)
	}
}
