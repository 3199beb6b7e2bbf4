package config

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// FuzzParse checks that Parse never panics and that any accepted
// configuration, re-encoded, parses back to the same value (R-CFG-5).
func FuzzParse(f *testing.F) {
	seeds := []string{
		`{}`,
		`{"max_streams":2,"resync_interval_ms":0,"streams":[` + validStream + `]}`,
		`{"streams":[{"instance_name":"a","dp_rank":1,"endpoint":"tcp://[::1]:5557","replay_endpoint":"tcp://h:2","topic":"x","hash_seed":7}]}`,
		`{"discovery":{"enabled":true,"hash_seed":0,"refresh_interval_ms":50}}`,
		`{"discovery":{"enabled":true},"streams":[` + validStream + `]}`,
		`{"max_streams":1.5}`,
		`{"streams":[{"instance_name":"a","endpoint":"tcp://*:1","replay_endpoint":"tcp://h:2"}]}`,
		`{"max_streams":1,"max_streams":1}`,
		`{"x":1}`,
		`[]`,
		`{} x`,
		`{"max_buffered_bytes":1024,"max_message_bytes":1024}`,
	}
	if b, err := os.ReadFile(filepath.Join("..", "..", "examples", "kv_events_discovery_config.json")); err == nil {
		seeds = append(seeds, string(b))
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			if c != nil {
				t.Fatalf("Parse returned both a config and %v", err)
			}
			return
		}
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatalf("marshal %+v: %v", c, err)
		}
		c2, err := Parse(b)
		if err != nil {
			t.Fatalf("re-encoded config %s rejected: %v", b, err)
		}
		if !reflect.DeepEqual(c, c2) {
			t.Fatalf("round trip changed the value:\n%+v\n%+v", c, c2)
		}
	})
}
