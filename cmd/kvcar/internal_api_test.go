package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/testlog"
)

// startAndStop runs kvcar with args until it listens, then stops it, and
// returns its log and its start-up error (nil if it served).
func startAndStop(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var log testlog.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan listening, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, append([]string{"--http_server_port=0", "--internal_port=0", "--rpc_server_port=0"}, args...), &log, ready)
	}()
	select {
	case <-ready:
		cancel()
		if err := <-errc; err != nil {
			t.Fatalf("kvcar %q exited with %v after it served", args, err)
		}
		return log.String(), nil
	case err := <-errc:
		return log.String(), err
	case <-time.After(10 * time.Second):
		t.Fatalf("kvcar %q neither served nor failed within 10s", args)
	}
	return "", nil
}

// TestInternalListenerExposure: an internal listener reachable from the
// network is refused without a token, unless --insecure_internal_api says
// so, which is then logged as a warning (issue 10 item 2); loopback and a
// token need neither.
func TestInternalListenerExposure(t *testing.T) {
	_, err := startAndStop(t, "--internal_host=0.0.0.0")
	if err == nil || !strings.Contains(err.Error(), "--internal_host") || !strings.Contains(err.Error(), "--insecure_internal_api") ||
		!strings.Contains(err.Error(), "token") {
		t.Fatalf("open internal listener without a token: %v, want a refusal naming the flags", err)
	}

	log, err := startAndStop(t, "--internal_host=0.0.0.0", "--insecure_internal_api")
	if err != nil {
		t.Fatalf("with --insecure_internal_api: %v", err)
	}
	if !strings.Contains(log, "level=WARN") || !strings.Contains(log, "insecure_internal_api") {
		t.Errorf("no warning logged for an open internal listener:\n%s", log)
	}

	// A token protects the HTTP listener, not the brpc one: xLLM's calls
	// carry no credentials, so it needs the engines' networks.
	tok := "--internal_api_token_file=" + writeConfig(t, "tok\n")
	_, err = startAndStop(t, "--internal_host=0.0.0.0", tok)
	if err == nil || !strings.Contains(err.Error(), "--rpc_allowed_networks") || !strings.Contains(err.Error(), "--insecure_internal_api") {
		t.Fatalf("open rpc listener without allowed networks: %v, want a refusal naming the flags", err)
	}
	log, err = startAndStop(t, "--internal_host=0.0.0.0", tok, "--rpc_allowed_networks=10.0.0.0/8, 192.0.2.7")
	if err != nil || strings.Contains(log, "insecure_internal_api") {
		t.Fatalf("with a token and allowed networks: %v\n%s", err, log)
	}
	_, err = startAndStop(t, "--internal_host=0.0.0.0", tok, "--rpc_allowed_networks=10.0.0.0/33")
	if err == nil || !strings.Contains(err.Error(), "--rpc_allowed_networks") || !strings.Contains(err.Error(), "10.0.0.0/33") {
		t.Fatalf("bad network accepted: %v", err)
	}
	log, err = startAndStop(t, "--internal_host=127.0.0.1")
	if err != nil || strings.Contains(log, "insecure_internal_api") {
		t.Fatalf("on loopback: %v\n%s", err, log)
	}

	// Engines elsewhere would be sent to an address they cannot reach.
	_, err = startAndStop(t, "--advertise_host=10.1.2.3")
	if err == nil || !strings.Contains(err.Error(), "--advertise_host") || !strings.Contains(err.Error(), "--internal_host") {
		t.Fatalf("non-loopback advertised host for a loopback listener: %v", err)
	}
}

// TestInternalRoutesNotOnPublicPort runs the command and checks each
// internal route on both ports: the public port does not serve it, the
// internal one does (issue 10 item 2).
func TestInternalRoutesNotOnPublicPort(t *testing.T) {
	addrs := startKVCar(t, "--internal_api_token=tok")
	for _, rt := range []struct{ method, path, body string }{
		{http.MethodPost, "/v1/internal/heartbeat", `{"name":"127.0.0.1:9","load_metrics":{"waiting_requests_num":1,"gpu_cache_usage_perc":0.1}}`},
		{http.MethodPost, "/v1/internal/kv-cache/query", `{"token_ids":[]}`},
		{http.MethodGet, "/v1/internal/kv-cache/streams", ""},
		{http.MethodGet, "/v1/internal/instances", ""},
		{http.MethodGet, "/debug/kvcar", ""},
		{http.MethodGet, "/debug/pprof/", ""},
		{http.MethodGet, "/metrics", ""},
	} {
		for _, token := range []string{"", "tok"} {
			if resp, body := send(t, rt.method, "http://"+addrs.public+rt.path, token, rt.body); resp.StatusCode != http.StatusNotFound {
				t.Errorf("public %s %s (token %q): %d %s, want 404", rt.method, rt.path, token, resp.StatusCode, body)
			}
		}
		if resp, body := send(t, rt.method, "http://"+addrs.internal+rt.path, "", rt.body); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("internal %s %s without the token: %d %s, want 401", rt.method, rt.path, resp.StatusCode, body)
		}
		if resp, body := send(t, rt.method, "http://"+addrs.internal+rt.path, "tok", rt.body); resp.StatusCode == http.StatusNotFound ||
			resp.StatusCode == http.StatusUnauthorized {
			t.Errorf("internal %s %s with the token: %d %s", rt.method, rt.path, resp.StatusCode, body)
		}
	}
	for _, addr := range []string{addrs.public, addrs.internal} {
		if resp, body := send(t, http.MethodGet, "http://"+addr+"/health", "", ""); resp.StatusCode != http.StatusOK {
			t.Errorf("%s/health: %d %s", addr, resp.StatusCode, body)
		}
	}
}
