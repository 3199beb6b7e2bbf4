package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// validStream is a stream element with only the required keys.
const validStream = `{"instance_name":"a","endpoint":"tcp://127.0.0.1:18000","replay_endpoint":"tcp://127.0.0.1:38000"}`

// wrap places key = value where the key lives in the file.
func wrap(path, value string) string {
	switch {
	case strings.HasPrefix(path, "discovery."):
		return fmt.Sprintf(`{"discovery":{%q:%s}}`, strings.TrimPrefix(path, "discovery."), value)
	case strings.HasPrefix(path, "streams[]."):
		name := strings.TrimPrefix(path, "streams[].")
		elem := strings.TrimSuffix(validStream, "}") + fmt.Sprintf(`,%q:%s}`, name, value)
		if name == "instance_name" || name == "endpoint" || name == "replay_endpoint" {
			var m map[string]json.RawMessage
			if err := json.Unmarshal([]byte(validStream), &m); err != nil {
				panic(err)
			}
			m[name] = json.RawMessage(value)
			b, err := json.Marshal(m)
			if err != nil {
				panic(err)
			}
			elem = string(b)
		}
		return `{"streams":[` + elem + `]}`
	default:
		return fmt.Sprintf(`{%q:%s}`, path, value)
	}
}

func errPath(path string) string {
	return strings.Replace(path, "streams[].", "streams[0].", 1)
}

func mustParse(t *testing.T, doc string) *Config {
	t.Helper()
	c, err := Parse([]byte(doc))
	if err != nil {
		t.Fatalf("Parse(%s): %v", doc, err)
	}
	return c
}

func mustFail(t *testing.T, doc string, wants ...string) *Error {
	t.Helper()
	c, err := Parse([]byte(doc))
	if err == nil {
		t.Fatalf("Parse(%s) accepted: %+v", doc, c)
	}
	for _, w := range wants {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Parse(%s) error %q does not mention %q", doc, err, w)
		}
	}
	var ce *Error
	if !errors.As(err, &ce) {
		t.Errorf("Parse(%s) error %T is not *config.Error", doc, err)
	}
	return ce
}

// integerKeys restates the defaults and ranges of R-CFG-2..4 and the
// ranges chosen in keys.go, independently of the key table.
var integerKeys = []struct {
	path     string
	def      int64
	min, max int64
	wantMs   bool
	get      func(c *Config) int64
}{
	{"max_streams", 128, 1, 128, false, func(c *Config) int64 { return int64(c.MaxStreams) }},
	{"max_blocks_per_stream", 262144, 1, 16777216, false, func(c *Config) int64 { return int64(c.MaxBlocksPerStream) }},
	{"max_message_bytes", 8388608, 1024, 268435456, false, func(c *Config) int64 { return int64(c.MaxMessageBytes) }},
	{"replay_timeout_ms", 2000, 100, 600000, true, func(c *Config) int64 { return int64(c.ReplayTimeout) }},
	{"resync_interval_ms", 30000, 1000, 86400000, true, func(c *Config) int64 { return int64(c.ResyncInterval) }},
	{"discovery.block_size", 128, 1, 4096, false, func(c *Config) int64 { return int64(c.Discovery.BlockSize) }},
	{"discovery.event_port_offset", 10000, 1, 65535, false, func(c *Config) int64 { return int64(c.Discovery.EventPortOffset) }},
	{"discovery.replay_port_offset", 30000, 1, 65535, false, func(c *Config) int64 { return int64(c.Discovery.ReplayPortOffset) }},
	{"discovery.refresh_interval_ms", 1000, 50, 60000, true, func(c *Config) int64 { return int64(c.Discovery.RefreshInterval) }},
	{"streams[].dp_rank", 0, 0, 1023, false, func(c *Config) int64 { return int64(c.Streams[0].DPRank) }},
	{"streams[].block_size", 128, 1, 4096, false, func(c *Config) int64 { return int64(c.Streams[0].BlockSize) }},
}

func asStored(v int64, ms bool) int64 {
	if ms {
		return int64(time.Duration(v) * time.Millisecond)
	}
	return v
}

// TestIntegerKeys covers default, bounds, out-of-range and wrong types of
// every integer key (R-CFG-2, R-CFG-3, R-CFG-4, R-CFG-5 "clear message
// naming the key").
func TestIntegerKeys(t *testing.T) {
	for _, k := range integerKeys {
		t.Run(k.path, func(t *testing.T) {
			absent := `{}`
			if strings.HasPrefix(k.path, "streams[]") {
				absent = `{"streams":[` + validStream + `]}`
			}
			if got := k.get(mustParse(t, absent)); got != asStored(k.def, k.wantMs) {
				t.Errorf("default = %d, want %d", got, asStored(k.def, k.wantMs))
			}
			for _, v := range []int64{k.min, k.max} {
				doc := wrap(k.path, strconv.FormatInt(v, 10))
				if k.path == "max_message_bytes" {
					// One message must fit in the snapshot buffer budget.
					doc = strings.Replace(doc, "{", `{"max_buffered_bytes":268435456,`, 1)
				}
				if got := k.get(mustParse(t, doc)); got != asStored(v, k.wantMs) {
					t.Errorf("%s: stored %d, want %d", doc, got, asStored(v, k.wantMs))
				}
			}
			rangeText := fmt.Sprintf("[%d, %d]", k.min, k.max)
			for _, v := range []int64{k.min - 1, k.max + 1} {
				if k.path == "resync_interval_ms" && v == 0 {
					continue // 0 disables calibration; covered below
				}
				val := strconv.FormatInt(v, 10)
				mustFail(t, wrap(k.path, val), "config: "+errPath(k.path)+" = "+val+": must be in ", rangeText)
			}
			for _, bad := range []struct{ value, got string }{
				{`"1"`, "a string"}, {`true`, "a boolean"}, {`null`, "null"}, {`[1]`, "an array"}, {`{}`, "an object"},
			} {
				mustFail(t, wrap(k.path, bad.value), errPath(k.path), "must be an integer, got "+bad.got)
			}
			for _, frac := range []string{"1.5", "128.0", "1e3", "-0.5"} {
				mustFail(t, wrap(k.path, frac), errPath(k.path)+" = "+frac+": must be an integer in ", rangeText)
			}
			mustFail(t, wrap(k.path, "99999999999999999999999"), errPath(k.path), "must be in")
		})
	}
}

func TestMaxBufferedBytes(t *testing.T) {
	// R-CFG-2: default 16 MiB; range chosen as [max_message_bytes, 4 GiB].
	if got := mustParse(t, `{}`).MaxBufferedBytes; got != 16<<20 {
		t.Fatalf("default = %d, want %d", got, 16<<20)
	}
	if got := mustParse(t, `{"max_buffered_bytes":4294967296}`).MaxBufferedBytes; got != 4<<30 {
		t.Fatalf("max = %d", got)
	}
	mustFail(t, `{"max_buffered_bytes":4294967297}`, "max_buffered_bytes = 4294967297: must be in [max_message_bytes, 4294967296]")
	mustFail(t, `{"max_buffered_bytes":1048576,"max_message_bytes":2097152}`, "max_buffered_bytes = 1048576", "at least max_message_bytes (2097152)")
	c := mustParse(t, `{"max_buffered_bytes":2097152,"max_message_bytes":2097152}`)
	if c.MaxBufferedBytes != c.MaxMessageBytes {
		t.Fatalf("equal budgets not stored: %+v", c)
	}
	mustFail(t, `{"max_buffered_bytes":"16"}`, "max_buffered_bytes", "must be an integer, got a string")
	mustFail(t, `{"max_buffered_bytes":1.5e7}`, "max_buffered_bytes", "must be an integer")
}

func TestResyncZeroDisables(t *testing.T) {
	// R-REC-4: resync_interval_ms 0 turns periodic calibration off.
	if got := mustParse(t, `{"resync_interval_ms":0}`).ResyncInterval; got != 0 {
		t.Fatalf("resync 0 stored as %v", got)
	}
	mustFail(t, `{"resync_interval_ms":999}`, "resync_interval_ms = 999: must be in 0 or [1000, 86400000]")
}

func TestHashSeedKeys(t *testing.T) {
	// R-CFG-4 hash_seed default 1024; discovery.hash_seed is this
	// package's extension with the same default.
	for _, path := range []string{"discovery.hash_seed", "streams[].hash_seed"} {
		get := func(c *Config) uint64 {
			if strings.HasPrefix(path, "streams") {
				return c.Streams[0].HashSeed
			}
			return c.Discovery.HashSeed
		}
		absent := `{"streams":[` + validStream + `]}`
		if got := get(mustParse(t, absent)); got != 1024 {
			t.Errorf("%s default = %d, want 1024", path, got)
		}
		for _, v := range []uint64{0, 18446744073709551615} {
			if got := get(mustParse(t, wrap(path, strconv.FormatUint(v, 10)))); got != v {
				t.Errorf("%s = %d stored as %d", path, v, got)
			}
		}
		mustFail(t, wrap(path, "-1"), errPath(path)+" = -1: must be in [0, 18446744073709551615]")
		mustFail(t, wrap(path, "18446744073709551616"), errPath(path), "must be in [0, 18446744073709551615]")
		mustFail(t, wrap(path, "1.5"), errPath(path), "must be an integer")
		mustFail(t, wrap(path, `"7"`), errPath(path), "must be an integer, got a string")
	}
}

func TestStringAndBoolKeys(t *testing.T) {
	// R-CFG-3 discovery.enabled and topic "xllm-kv"; R-CFG-4 topic "".
	c := mustParse(t, `{"streams":[`+validStream+`]}`)
	if c.Discovery.Enabled || c.Discovery.Topic != "xllm-kv" || c.Streams[0].Topic != "" {
		t.Fatalf("defaults: %+v", c)
	}
	c = mustParse(t, `{"discovery":{"enabled":true,"topic":"t\u00e9 x"}}`)
	if !c.Discovery.Enabled || c.Discovery.Topic != "té x" {
		t.Fatalf("values: %+v", c.Discovery)
	}
	if got := mustParse(t, wrap("streams[].topic", `"kv"`)).Streams[0].Topic; got != "kv" {
		t.Fatalf("stream topic = %q", got)
	}
	if got := mustParse(t, wrap("streams[].instance_name", `"p-0"`)).Streams[0].InstanceName; got != "p-0" {
		t.Fatalf("instance_name = %q", got)
	}
	mustFail(t, wrap("discovery.enabled", `"true"`), "discovery.enabled", "must be a boolean, got a string")
	mustFail(t, wrap("discovery.enabled", `1`), "discovery.enabled", "must be a boolean, got a number")
	mustFail(t, wrap("discovery.topic", `7`), "discovery.topic", "must be a string, got a number")
	mustFail(t, wrap("streams[].topic", `null`), "streams[0].topic", "must be a string, got null")
	mustFail(t, wrap("streams[].instance_name", `""`), "streams[0].instance_name", "non-empty")
	mustFail(t, wrap("streams[].instance_name", `"  "`), "streams[0].instance_name", "non-empty")
	mustFail(t, wrap("streams[].instance_name", `1`), "streams[0].instance_name", "must be a string, got a number")
	mustFail(t, wrap("streams[].endpoint", `5557`), "streams[0].endpoint", "must be a string, got a number")
	mustFail(t, `{"discovery":[]}`, "discovery", "must be an object, got an array")
	mustFail(t, `{"discovery":null}`, "discovery", "must be an object, got null")
	mustFail(t, `{"streams":{}}`, "streams", "must be an array, got an object")
	mustFail(t, `{"streams":[1]}`, "streams[0]", "must be an object, got a number")
}

func TestRequiredStreamKeys(t *testing.T) {
	// R-CFG-4: instance_name, endpoint and replay_endpoint are required.
	for _, key := range []string{"instance_name", "endpoint", "replay_endpoint"} {
		var m map[string]any
		if err := json.Unmarshal([]byte(validStream), &m); err != nil {
			t.Fatal(err)
		}
		delete(m, key)
		b, _ := json.Marshal(m)
		mustFail(t, `{"streams":[`+validStream+`,`+string(b)+`]}`, "config: streams[1]."+key+": is required")
	}
}

func TestEndpointForms(t *testing.T) {
	// R-CFG-4: endpoints are connectable TCP addresses; * and 0.0.0.0 rejected.
	good := []string{
		"tcp://127.0.0.1:5557", "tcp://localhost:1", "tcp://engine-0.svc.cluster.local:65535",
		"tcp://[::1]:5557", "tcp://[fe80::1%eth0]:5557", "tcp://10.0.0.7:00080",
	}
	for _, ep := range good {
		c := mustParse(t, wrap("streams[].endpoint", strconv.Quote(ep)))
		if c.Streams[0].Endpoint != ep {
			t.Errorf("endpoint %q stored as %q", ep, c.Streams[0].Endpoint)
		}
	}
	bad := map[string]string{
		"tcp://*:5557":          "bind wildcard",
		"tcp://0.0.0.0:5557":    "unspecified",
		"tcp://[::]:5557":       "unspecified",
		"tcp://:::5557":         "must be tcp://host:port",
		"tcp://:5557":           "host is empty",
		"tcp://[]:5557":         "host is empty",
		"tcp://::1:5557":        "must be tcp://host:port",
		"tcp://[127.0.0.1]:1":   "IPv6 hosts in brackets",
		"tcp://[host]:1":        "must be an IPv6 address",
		"tcp://127.0.0.1":       "must be tcp://host:port",
		"tcp://127.0.0.1:0":     "port must be a number in [1, 65535]",
		"tcp://127.0.0.1:65536": "port must be a number in [1, 65535]",
		"tcp://127.0.0.1:-1":    "port must be a number",
		"tcp://127.0.0.1:http":  "port must be a number",
		"tcp://127.0.0.1:":      "port must be a number",
		"udp://127.0.0.1:5557":  "only the tcp transport",
		"127.0.0.1:5557":        "only the tcp transport",
		"TCP://127.0.0.1:5557":  "only the tcp transport",
		"tcp://h/x:5557":        "without path",
		"tcp://a b:5557":        "without path",
		"tcp://0:5557":          "not a valid IPv4 address",
		"tcp://127.1:5557":      "not a valid IPv4 address",
		"tcp://a..b:5557":       "empty or over-long label",
		"tcp://h$st:5557":       "not allowed in a host name",
		"":                      "non-empty",
	}
	for ep, want := range bad {
		for _, key := range []string{"endpoint", "replay_endpoint"} {
			if ep == "" && key == "replay_endpoint" {
				want = "is required when sync_mode is snapshot"
			}
			mustFail(t, wrap("streams[]."+key, strconv.Quote(ep)), "streams[0]."+key, want)
		}
	}
}

// Sync modes: one of three names; a live stream has no replay endpoint,
// the others need one; discovery picks a mode per backend_type.
func TestSyncModes(t *testing.T) {
	c := mustParse(t, `{}`)
	if d := c.Discovery; d.SyncMode != SyncSnapshot || d.VLLMSyncMode != SyncLive || d.SGLangSyncMode != SyncLive {
		t.Fatalf("defaults %+v", d)
	}
	c = mustParse(t, `{"discovery":{"sync_mode":"history","vllm_sync_mode":"history","sglang_sync_mode":"snapshot"}}`)
	for backend, want := range map[string]SyncMode{"": SyncHistory, "xllm": SyncHistory, "vllm": SyncHistory, "sglang": SyncSnapshot, "trtllm": SyncHistory} {
		if got := c.Discovery.ModeFor(backend); got != want {
			t.Errorf("ModeFor(%q) = %s, want %s", backend, got, want)
		}
	}
	mustFail(t, `{"discovery":{"vllm_sync_mode":"Live"}}`, "discovery.vllm_sync_mode", "must be one of snapshot, history, live")
	mustFail(t, `{"discovery":{"sync_mode":1}}`, "discovery.sync_mode", "must be a string")

	live := `{"streams":[{"instance_name":"a","endpoint":"tcp://h:1","sync_mode":"live"}]}`
	if c := mustParse(t, live); c.Streams[0].SyncMode != SyncLive || c.Streams[0].ReplayEndpoint != "" {
		t.Fatalf("live stream %+v", c.Streams[0])
	}
	mustFail(t, `{"streams":[{"instance_name":"a","endpoint":"tcp://h:1","sync_mode":"live","replay_endpoint":"tcp://h:2"}]}`,
		"streams[0].replay_endpoint", "must be absent when sync_mode is live")
	mustFail(t, `{"streams":[{"instance_name":"a","endpoint":"tcp://h:1","sync_mode":"history"}]}`,
		"streams[0].replay_endpoint", "is required when sync_mode is history")
	if c := mustParse(t, `{"streams":[{"instance_name":"a","endpoint":"tcp://h:1","sync_mode":"history","replay_endpoint":"tcp://h:2"}]}`); c.Streams[0].SyncMode != SyncHistory {
		t.Fatalf("history stream %+v", c.Streams[0])
	}
	// Two live streams have no replay endpoints to collide.
	mustParse(t, `{"streams":[{"instance_name":"a","endpoint":"tcp://h:1","sync_mode":"live"},{"instance_name":"b","endpoint":"tcp://h:2","sync_mode":"live"}]}`)
}

func TestDuplicates(t *testing.T) {
	// R-CFG-4: duplicate instance/DP and duplicate endpoints are rejected.
	s := func(name string, rank int, ep, rep string) string {
		return fmt.Sprintf(`{"instance_name":%q,"dp_rank":%d,"endpoint":%q,"replay_endpoint":%q}`, name, rank, ep, rep)
	}
	doc := func(elems ...string) string { return `{"streams":[` + strings.Join(elems, ",") + `]}` }

	c := mustParse(t, doc(s("a", 0, "tcp://h:1", "tcp://h:2"), s("a", 1, "tcp://h:3", "tcp://h:4"), s("b", 0, "tcp://h:5", "tcp://h:6")))
	if len(c.Streams) != 3 || c.Streams[1].DPRank != 1 || c.Streams[2].InstanceName != "b" {
		t.Fatalf("streams: %+v", c.Streams)
	}
	mustFail(t, doc(s("a", 0, "tcp://h:1", "tcp://h:2"), s("a", 0, "tcp://h:3", "tcp://h:4")),
		"streams[1]", `instance_name "a" with dp_rank 0 duplicates streams[0]`)
	mustFail(t, doc(s("a", 0, "tcp://h:1", "tcp://h:2"), s("b", 0, "tcp://h:1", "tcp://h:4")),
		"streams[1].endpoint", "duplicates streams[0].endpoint")
	mustFail(t, doc(s("a", 0, "tcp://h:1", "tcp://h:2"), s("b", 0, "tcp://h:2", "tcp://h:4")),
		"streams[1].endpoint", "duplicates streams[0].replay_endpoint")
	mustFail(t, doc(s("a", 0, "tcp://h:1", "tcp://h:2"), s("b", 0, "tcp://h:3", "tcp://h:1")),
		"streams[1].replay_endpoint", "duplicates streams[0].endpoint")
	mustFail(t, doc(s("a", 0, "tcp://h:1", "tcp://h:1")), "streams[0].replay_endpoint", "duplicates streams[0].endpoint")
	// Spellings of one address are one address.
	mustFail(t, doc(s("a", 0, "tcp://H:1", "tcp://h:01")), "streams[0].replay_endpoint", "duplicates streams[0].endpoint")
	mustFail(t, doc(s("a", 0, "tcp://[::1]:1", "tcp://[0:0::1]:1")), "streams[0].replay_endpoint", "duplicates")
}

func TestStreamCountLimit(t *testing.T) {
	// R-CFG-2 / R-DISC-7: at most max_streams streams.
	var elems []string
	for i := range 3 {
		elems = append(elems, fmt.Sprintf(`{"instance_name":"i","dp_rank":%d,"endpoint":"tcp://h:%d","replay_endpoint":"tcp://h:%d"}`, i, 100+i, 200+i))
	}
	list := strings.Join(elems, ",")
	if c := mustParse(t, `{"max_streams":3,"streams":[`+list+`]}`); len(c.Streams) != 3 {
		t.Fatalf("streams: %d", len(c.Streams))
	}
	mustFail(t, `{"streams":[`+list+`],"max_streams":2}`, "config: streams = 3 elements: must have at most max_streams (2) elements")
}

func TestDiscoveryStreamsExclusive(t *testing.T) {
	// R-CFG-5: discovery and a non-empty streams list are mutually exclusive.
	mustFail(t, `{"discovery":{"enabled":true},"streams":[`+validStream+`]}`, "streams", "discovery.enabled", "R-CFG-5")
	c := mustParse(t, `{"discovery":{"enabled":true},"streams":[]}`)
	if !c.Discovery.Enabled || c.Streams != nil {
		t.Fatalf("enabled discovery with empty streams: %+v", c)
	}
	c = mustParse(t, `{"discovery":{"enabled":false},"streams":[`+validStream+`]}`)
	if c.Discovery.Enabled || len(c.Streams) != 1 {
		t.Fatalf("disabled discovery with streams: %+v", c)
	}
	mustFail(t, `{"discovery":{"event_port_offset":20000,"replay_port_offset":20000}}`, "discovery.replay_port_offset = 20000", "must differ")
}

func TestIdleConfig(t *testing.T) {
	// Neither discovery nor streams: a valid, idle directory.
	c := mustParse(t, " {\n} \n")
	if want := Default(); !reflect.DeepEqual(*c, want) {
		t.Fatalf("idle config %+v differs from Default %+v", *c, want)
	}
	if c.Discovery.Enabled || c.Streams != nil {
		t.Fatalf("idle config is not idle: %+v", c)
	}
}

func TestFileLevelRejections(t *testing.T) {
	// R-CFG-5: validation at start-up with a clear message.
	mustFail(t, ``, "empty")
	mustFail(t, `   `, "empty")
	mustFail(t, `[]`, "top level must be a JSON object, got an array")
	mustFail(t, `"x"`, "top level must be a JSON object, got a string")
	mustFail(t, `null`, "top level must be a JSON object, got null")
	mustFail(t, `{} {}`, "trailing data")
	mustFail(t, `{}x`, "trailing data")
	mustFail(t, `{"max_streams":1`, "invalid JSON")
	mustFail(t, `{"max_streams":01}`, "invalid JSON")
	mustFail(t, `{max_streams:1}`, "invalid JSON")
	mustFail(t, `{"max_streams":1,"max_streams":2}`, "config: max_streams: key given more than once")
	mustFail(t, `{"discovery":{"topic":"a","topic":"b"}}`, "discovery.topic: key given more than once")
	big := `{"discovery":{"topic":"` + strings.Repeat("x", MaxFileBytes) + `"}}`
	mustFail(t, big, "exceeds 1048576 bytes")
}

func TestUnknownKeys(t *testing.T) {
	// Policy: misspelt keys are rejected, naming the full path.
	mustFail(t, `{"max_stream":1}`, "config: max_stream: unknown key")
	mustFail(t, `{"discovery":{"enable":true}}`, "config: discovery.enable: unknown key")
	mustFail(t, `{"streams":[`+validStream+`,{"instance_name":"b","endpoint":"tcp://h:1","replay_endpoint":"tcp://h:2","dprank":1}]}`,
		"config: streams[1].dprank: unknown key")
	mustFail(t, `{"Max_Streams":1}`, "Max_Streams: unknown key")
}

// TestReferenceMatchesParser checks that the reference and the parser
// describe the same keys, and that the reference covers every field.
func TestReferenceMatchesParser(t *testing.T) {
	ref := Reference()
	refKeys := make(map[string]bool, len(ref))
	for _, d := range ref {
		if d.Key == "" || d.Default == "" || d.Range == "" || d.Description == "" {
			t.Errorf("incomplete reference row %+v", d)
		}
		if refKeys[d.Key] {
			t.Errorf("reference key %s listed twice", d.Key)
		}
		refKeys[d.Key] = true
		// Every documented key is accepted with its documented default.
		value := d.Default
		switch value {
		case "(required)", "(required unless live)":
			continue // present in validStream, accepted by every test that parses it
		case "{}", "[]":
		}
		if _, err := Parse([]byte(wrap(d.Key, value))); err != nil {
			t.Errorf("documented key %s = %s rejected: %v", d.Key, value, err)
		}
	}
	// Every key the parser writes when it re-encodes a full configuration
	// (which is every key it accepts, each with a field) is documented.
	c := mustParse(t, `{"streams":[`+validStream+`]}`)
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for k, v := range doc {
		seen[k] = true
		var sub map[string]json.RawMessage
		var list []map[string]json.RawMessage
		switch {
		case json.Unmarshal(v, &sub) == nil:
			for sk := range sub {
				seen[k+"."+sk] = true
			}
		case json.Unmarshal(v, &list) == nil:
			for sk := range list[0] {
				seen[k+"[]."+sk] = true
			}
		}
	}
	if !reflect.DeepEqual(seen, refKeys) {
		t.Errorf("encoded keys %v\ndiffer from reference keys %v", seen, refKeys)
	}
	// Each exported field of the configuration types is bound to exactly
	// one key, so no field is left without a way to set it.
	countFields := func(v any) int { return reflect.TypeOf(v).NumField() }
	leaves := countFields(Config{}) - 2 + countFields(Discovery{}) + countFields(Stream{})
	if got := len(ref) - 2; got != leaves {
		t.Errorf("reference has %d leaf keys, configuration types have %d fields", got, leaves)
	}
	bound := map[uintptr]string{}
	var c2 Config
	c2.Streams = make([]Stream, 1)
	tg := target{cfg: &c2, disc: &c2.Discovery}
	for i := range keyTable {
		k := &keyTable[i]
		if k.field == nil {
			continue
		}
		if k.scope == scopeStream {
			tg.stream = &c2.Streams[0]
		}
		addr := reflect.ValueOf(k.field(tg)).Pointer()
		if other, dup := bound[addr]; dup {
			t.Errorf("keys %s and %s write the same field", other, k.path(-1))
		}
		bound[addr] = k.path(-1)
	}
}

func TestExampleFile(t *testing.T) {
	// The shipped example (the design note's discovery example) loads.
	c, err := Load(filepath.Join("..", "..", "examples", "kv_events_discovery_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.Discovery = Discovery{Enabled: true, SyncMode: SyncSnapshot, VLLMSyncMode: SyncLive, SGLangSyncMode: SyncLive,
		BlockSize: 128, Topic: "xllm-kv", EventPortOffset: 10000, ReplayPortOffset: 30000, SubscribeBindPorts: 1,
		RefreshInterval: time.Second, HashSeed: 1024}
	if !reflect.DeepEqual(*c, want) {
		t.Fatalf("example = %+v, want %+v", *c, want)
	}
}

func TestLoadErrorsNamePath(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.json")
	if _, err := Load(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("missing file error %v does not name %s", err, missing)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"streams":[{"instance_name":"a","dp_rank":5000,"endpoint":"tcp://h:1","replay_endpoint":"tcp://h:2"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(bad)
	if err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "config: streams[0].dp_rank = 5000: must be in [0, 1023]") {
		t.Fatalf("bad file error: %v", err)
	}
	huge := filepath.Join(dir, "huge.json")
	if err := os.WriteFile(huge, []byte(`{"discovery":{"topic":"`+strings.Repeat("y", MaxFileBytes)+`"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(huge); err == nil || !strings.Contains(err.Error(), "exceeds") {
		t.Fatalf("huge file error: %v", err)
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	src := `{"max_streams":4,"resync_interval_ms":0,"streams":[` +
		`{"instance_name":"n\"1\u0000","dp_rank":3,"block_size":16,"endpoint":"tcp://[::1]:5557","replay_endpoint":"tcp://h:2","topic":"<t>","hash_seed":18446744073709551615}]}`
	c := mustParse(t, src)
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	c2 := mustParse(t, string(b))
	if !reflect.DeepEqual(c, c2) {
		t.Fatalf("round trip changed the value:\n%+v\n%+v", c, c2)
	}
	if c.Streams[0].InstanceName != "n\"1\x00" || c.Streams[0].HashSeed != 1<<64-1 {
		t.Fatalf("values: %+v", c.Streams[0])
	}
}

// Topic templates: placeholders are checked at start-up and expanded per
// stream; the empty template stays empty (every topic).
func TestTopicTemplates(t *testing.T) {
	c := mustParse(t, `{"discovery":{"topic":"kv@{name}@{dp_rank}","vllm_topic":"kv@{host}:{port}","sglang_topic":""}}`)
	d := c.Discovery
	for backend, want := range map[string]string{"": "kv@10.0.0.5:8000@1", "xllm": "kv@10.0.0.5:8000@1", "vllm": "kv@10.0.0.5:8000", "sglang": ""} {
		if got := ExpandTopic(d.TopicFor(backend), "10.0.0.5:8000", "10.0.0.5", "8000", 1); got != want {
			t.Errorf("%q: topic %q, want %q", backend, got, want)
		}
	}
	if d := mustParse(t, `{}`).Discovery; d.Topic != "xllm-kv" || d.VLLMTopic != "" || d.SGLangTopic != "" {
		t.Fatalf("default topics %q %q %q", d.Topic, d.VLLMTopic, d.SGLangTopic)
	}
	mustFail(t, `{"discovery":{"topic":"kv@{pod}"}}`, "discovery.topic", "unknown placeholder {pod}")
	mustFail(t, `{"discovery":{"vllm_topic":"kv@{name"}}`, "discovery.vllm_topic", "has a { without a }")
	mustFail(t, `{"discovery":{"sglang_topic":"kv}"}}`, "discovery.sglang_topic", "has a } without a {")
}

// Bound-subscriber mode (item 5): the bind address may use a wildcard;
// every topic template must name the instance; bound static streams share
// an endpoint told apart by topic and rank.
func TestSubscribeBind(t *testing.T) {
	c := mustParse(t, `{"discovery":{"subscribe_bind":"tcp://*:5557","subscribe_bind_ports":2,"topic":"kv@{name}","vllm_topic":"kv@{host}:{port}","sglang_topic":"x{name}"}}`)
	if got := BindPorts(c.Discovery.SubscribeBind, c.Discovery.SubscribeBindPorts); strings.Join(got, " ") != "tcp://*:5557 tcp://*:5558" {
		t.Fatalf("bind ports %v", got)
	}
	mustFail(t, `{"discovery":{"subscribe_bind":"tcp://*:5557","topic":"kv@{name}","sglang_topic":"x{name}"}}`,
		"discovery.vllm_topic", "must contain {name}")
	mustFail(t, `{"discovery":{"subscribe_bind":"tcp://*:65535","subscribe_bind_ports":2,"topic":"{name}","vllm_topic":"{name}","sglang_topic":"{name}"}}`,
		"discovery.subscribe_bind_ports", "above 65535")
	mustFail(t, `{"discovery":{"subscribe_bind":"udp://*:1"}}`, "discovery.subscribe_bind", "only the tcp transport")
	mustFail(t, `{"discovery":{"subscribe_bind":"tcp://*:0"}}`, "discovery.subscribe_bind", "port must be")

	ok := `{"streams":[
		{"instance_name":"a","endpoint":"tcp://0.0.0.0:5557","bind":true,"topic":"kv@a","sync_mode":"live"},
		{"instance_name":"b","endpoint":"tcp://0.0.0.0:5557","bind":true,"topic":"kv@b","sync_mode":"live"},
		{"instance_name":"b","dp_rank":1,"endpoint":"tcp://0.0.0.0:5557","bind":true,"topic":"kv@b","sync_mode":"live"}]}`
	if c := mustParse(t, ok); !c.Streams[0].Bind || c.Streams[2].Endpoint != "tcp://0.0.0.0:5557" {
		t.Fatalf("bound streams %+v", c.Streams)
	}
	mustFail(t, `{"streams":[{"instance_name":"a","endpoint":"tcp://0.0.0.0:5557","sync_mode":"live"}]}`, "streams[0].endpoint", "unspecified")
	mustFail(t, `{"streams":[{"instance_name":"a","endpoint":"tcp://*:5557","bind":true,"sync_mode":"live"}]}`, "streams[0].topic", "must not be empty")
	mustFail(t, `{"streams":[{"instance_name":"a","endpoint":"tcp://*:5557","bind":true,"topic":"t","sync_mode":"live"},
		{"instance_name":"b","endpoint":"tcp://*:5557","bind":true,"topic":"t","sync_mode":"live"}]}`, "streams[1].topic", "duplicates streams[0]")
	mustFail(t, `{"streams":[{"instance_name":"a","endpoint":"tcp://h:5557","bind":true,"topic":"t","sync_mode":"live"},
		{"instance_name":"b","endpoint":"tcp://h:5557","sync_mode":"live"}]}`, "streams[1].endpoint", "is bound by another stream")
}

// TestBindIsLoopback: which bind addresses bind loopback only. Parse
// takes only tcp://host:port binds; any other form is not known to be
// loopback.
func TestBindIsLoopback(t *testing.T) {
	for e, want := range map[string]bool{
		"tcp://127.0.0.1:5557": true, "tcp://127.1.2.3:5557": true, "tcp://[::1]:5557": true, "tcp://localhost:5557": true,
		"tcp://[::ffff:127.0.0.1]:5557": true,
		"tcp://*:5557":                  false, "tcp://0.0.0.0:5557": false, "tcp://[::]:5557": false, "tcp://10.0.0.5:5557": false,
		"tcp://eth0:5557": false, "tcp://kvcar.example:5557": false, "tcp://127.0.0.1": false,
		"ipc:///tmp/kv": false, "inproc://kv": false,
	} {
		if got := BindIsLoopback(e); got != want {
			t.Errorf("BindIsLoopback(%q) = %v, want %v", e, got, want)
		}
	}
}
