package main

import (
	"io"
	"strings"
	"testing"

	"github.com/kvcar/kvcar/internal/server"
)

// TestKVCarOwnsRouting covers issue 10 items 3 and 6 end to end: a
// client's own "routing" object never reaches the engine, which sees
// kvcar's decision as the routing of the request it takes over baidu_std
// (an xLLM engine; server tests cover the body and headers a vLLM engine
// gets), for completions and chat; and without
// --expose_routing_headers no engine name or decision detail comes back
// in the response headers.
func TestKVCarOwnsRouting(t *testing.T) {
	c := startCluster(t, 2, nil, "--load_balance_policy=RR")
	forged := `"routing":{"prefill_name":"10.9.9.9:1","decode_name":"10.9.9.9:2"}`
	for _, tc := range []struct{ path, body string }{
		{"/v1/completions", `{"model":"m","max_tokens":2,` + forged + `,"prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`},
		{"/v1/completions", `{"model":"m","prompt":"hello there","max_tokens":2, ` + forged + ` }`},
		{"/v1/chat/completions", `{` + forged + `,"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`},
	} {
		for range 2 { // both engines, by RR
			resp, b := postJSON(t, "http://"+c.addr+tc.path, "", tc.body)
			if resp.StatusCode != 200 {
				t.Fatalf("%s %s: %d %s", tc.path, tc.body, resp.StatusCode, b)
			}
			eu, ok := engineReport(b, c.engines)
			if !ok || eu.Instance == "" || eu.PrefillName != eu.Instance || eu.DecodeName != "" {
				t.Errorf("%s: engine %s saw routing names %q/%q, not kvcar's decision (%s)", tc.path, eu.Instance,
					eu.PrefillName, eu.DecodeName, b)
			}
			for k := range resp.Header {
				if strings.HasPrefix(k, "X-Kvcar-") || k == "X-Prefill-Name" || k == "X-Decode-Name" {
					t.Errorf("%s: header %s sent without --expose_routing_headers", tc.path, k)
				}
			}
		}
	}
	for _, e := range c.engines {
		if st := e.Stats(); st.Misrouted != 0 {
			t.Errorf("engine %s counted %d requests whose routing named another engine", e.Name(), st.Misrouted)
		}
	}
}

// TestRequestPathFlags: the request path's limits default to the
// server's and a value out of range stops start-up naming the flag and
// its range.
func TestRequestPathFlags(t *testing.T) {
	f, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if f.maxRequestBody != server.DefaultMaxRequestBodyBytes || f.maxInflightRequest != server.DefaultMaxInflightRequestBytes ||
		f.maxPromptText != server.DefaultMaxPromptTextBytes || f.exposeRouting {
		t.Fatalf("defaults: %+v", f)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--max_request_body_bytes=1000"}, "--max_request_body_bytes = 1000: must be in [1024, 1073741824]"},
		{[]string{"--max_request_body_bytes=4096", "--max_inflight_request_bytes=4095"}, "--max_inflight_request_bytes = 4095: must be in [4096, "},
		{[]string{"--max_prompt_text_bytes=0"}, "--max_prompt_text_bytes = 0: must be in [1, 16777216]"},
		{[]string{"--max_request_body_bytes=4096", "--max_prompt_text_bytes=4097"}, "--max_prompt_text_bytes = 4097: must be in [1, 4096]"},
	} {
		if _, err := parseFlags(tc.args, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
}
