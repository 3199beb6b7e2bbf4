package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvcar/kvcar/internal/freeport"
)

// TestHubBindOffLoopbackNeedsOptOut: a subscriber kvcar binds for
// engines to dial (discovery.subscribe_bind, or a stream with bind) takes
// any peer's KV events under any engine's topic, so one bound off
// loopback stops start-up naming its key, unless --insecure_internal_api,
// which logs a warning; one on loopback starts.
func TestHubBindOffLoopbackNeedsOptOut(t *testing.T) {
	port, err := freeport.Run(2)
	if err != nil {
		t.Fatal(err)
	}
	discovery := func(host string) string {
		return writeConfig(t, fmt.Sprintf(`{"discovery":{"enabled":true,"subscribe_bind":"tcp://%s:%d",`+
			`"topic":"kv@{name}","vllm_topic":"kv@{name}","sglang_topic":"kv@{name}"}}`, host, port))
	}
	stream := writeConfig(t, fmt.Sprintf(`{"streams":[{"instance_name":"e1","endpoint":"tcp://0.0.0.0:%d","bind":true,"topic":"kv@e1","sync_mode":"live"}]}`, port+1))
	for _, tc := range []struct {
		name, cfg, key string
	}{
		{"subscribe_bind on every address", discovery("*"), "discovery.subscribe_bind"},
		{"subscribe_bind on 0.0.0.0", discovery("0.0.0.0"), "discovery.subscribe_bind"},
		{"a static stream's bind", stream, "streams[0].endpoint"},
	} {
		log, err := startAndStop(t, "--kv_events_config_file="+tc.cfg, "--log_level=warn")
		if err == nil || !strings.Contains(err.Error(), tc.key) || !strings.Contains(err.Error(), "--insecure_internal_api") {
			t.Errorf("%s: start-up error %v, want a refusal naming %s and the opt-out\nlog:\n%s", tc.name, err, tc.key, log)
		}
		log, err = startAndStop(t, "--kv_events_config_file="+tc.cfg, "--log_level=warn", "--insecure_internal_api")
		if err != nil || !strings.Contains(log, "a bound KV event subscriber is reachable from the network") {
			t.Errorf("%s with --insecure_internal_api: %v, want a start with a warning\nlog:\n%s", tc.name, err, log)
		}
	}
	if log, err := startAndStop(t, "--kv_events_config_file="+discovery("127.0.0.1"), "--log_level=warn"); err != nil {
		t.Errorf("subscribe_bind on loopback: %v\nlog:\n%s", err, log)
	}
}
