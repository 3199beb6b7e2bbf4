package instance

import (
	"strings"
	"testing"
)

func TestParseMetaDefaults(t *testing.T) {
	m, err := parseMeta([]byte(`{"name":"127.0.0.1:8000","rpc_address":"127.0.0.1:9000","type":3}`))
	if err != nil {
		t.Fatal(err)
	}
	if m.DPSize != 1 || m.KVSplitSize != 1 || m.BackendType != "xllm" || m.Type != Mix || m.incarnation() != "" {
		t.Errorf("defaults: %+v", m)
	}
	m, err = parseMeta([]byte(`{"name":"n:1","rpc_address":"","type":0,"dp_size":0,"backend_type":"","incarnation_id":null,"ports":null}`))
	if err != nil {
		t.Fatal(err)
	}
	if m.DPSize != 1 || m.BackendType != "xllm" {
		t.Errorf("zero values not defaulted: %+v", m)
	}
}

func TestParseMetaRejects(t *testing.T) {
	for _, tc := range []struct{ value, want string }{
		{`{`, "unexpected end"},
		{`{"rpc_address":"x","type":0}`, "name missing"},
		{`{"name":"","rpc_address":"x","type":0}`, "name missing"},
		{`{"name":"n","type":0}`, "rpc_address missing"},
		{`{"name":"n","rpc_address":"x"}`, "type missing"},
		{`{"name":"n","rpc_address":"x","type":null}`, "type missing"},
		{`{"name":"n","rpc_address":"x","type":-1}`, "type -1"},
		{`{"name":"n","rpc_address":"x","type":1,"dp_size":-2}`, "dp_size -2"},
		{`{"name":"n","rpc_address":"x","type":1,"ports":[70000]}`, "ports"},
		{`{"name":"n","rpc_address":"x","type":1,"dp_size":"2"}`, "dp_size"},
	} {
		_, err := parseMeta([]byte(tc.value))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseMeta(%s) = %v, want an error with %q", tc.value, err, tc.want)
		}
	}
}

func TestLoadValue(t *testing.T) {
	v, err := encodeLoadValue(Load{WaitingRequests: 3, GPUCacheUsagePerc: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	if string(v) != `{"waiting_requests_num":3,"gpu_cache_usage_perc":0.5}` {
		t.Errorf("encoded %s", v)
	}
	l, err := parseLoadValue(v)
	if err != nil || l != (Load{3, 0.5}) {
		t.Errorf("round trip: %+v %v", l, err)
	}
	for _, bad := range []string{`{"gpu_cache_usage_perc":0.5}`, `{"waiting_requests_num":1}`, `{"waiting_requests_num":-1,"gpu_cache_usage_perc":0}`, `x`} {
		if _, err := parseLoadValue([]byte(bad)); err == nil {
			t.Errorf("parseLoadValue(%s) succeeded", bad)
		}
	}
}
