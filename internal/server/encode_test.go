package server

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestAppendMatches checks that the hand-written encoder emits valid JSON
// with every R-API-4 field and the values it was given.
func TestAppendMatches(t *testing.T) {
	in := []Match{
		{InstanceName: "p-0", DPRank: 0, Synchronized: true, Complete: true, Sequence: 18446744073709551615,
			DeviceHitTokens: 256, HostOnlyHitTokens: 128, ReusablePrefixTokens: 384, DeviceBlocks: 262144, HostBlocks: 7},
		{InstanceName: "p\"1\\\n\t\x00\u2028é", DPRank: 1023, Error: "snapshot pending: \"replay\" timed out <after> 2s"},
		{InstanceName: "bad\xffutf8", DPRank: 3, Error: "x"},
	}
	out := append(appendMatches([]byte(`{"matches":`), in), '}')
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.DisallowUnknownFields()
	var got struct {
		Matches []struct {
			InstanceName         *string `json:"instance_name"`
			DPRank               *int    `json:"dp_rank"`
			Synchronized         *bool   `json:"synchronized"`
			Complete             *bool   `json:"complete"`
			Sequence             *uint64 `json:"sequence"`
			DeviceHitTokens      *int    `json:"device_hit_tokens"`
			HostOnlyHitTokens    *int    `json:"host_only_hit_tokens"`
			ReusablePrefixTokens *int    `json:"reusable_prefix_tokens"`
			DeviceBlocks         *int    `json:"device_blocks"`
			HostBlocks           *int    `json:"host_blocks"`
			Error                *string `json:"error"`
		} `json:"matches"`
	}
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("encoder output %s: %v", out, err)
	}
	if len(got.Matches) != len(in) {
		t.Fatalf("%d matches, want %d", len(got.Matches), len(in))
	}
	for i, m := range got.Matches {
		if m.InstanceName == nil || m.DPRank == nil || m.Synchronized == nil || m.Complete == nil || m.Sequence == nil ||
			m.DeviceHitTokens == nil || m.HostOnlyHitTokens == nil || m.ReusablePrefixTokens == nil ||
			m.DeviceBlocks == nil || m.HostBlocks == nil || m.Error == nil {
			t.Fatalf("match %d lacks a field: %s", i, out)
		}
		want := in[i]
		want.InstanceName = strings.ToValidUTF8(want.InstanceName, "\uFFFD")
		decoded := Match{InstanceName: *m.InstanceName, DPRank: *m.DPRank, Synchronized: *m.Synchronized, Complete: *m.Complete,
			Sequence: *m.Sequence, DeviceHitTokens: *m.DeviceHitTokens, HostOnlyHitTokens: *m.HostOnlyHitTokens,
			ReusablePrefixTokens: *m.ReusablePrefixTokens, DeviceBlocks: *m.DeviceBlocks, HostBlocks: *m.HostBlocks, Error: *m.Error}
		if decoded != want {
			t.Errorf("match %d = %+v, want %+v", i, decoded, want)
		}
	}
	if !bytes.Contains(out, []byte(`"error":""`)) {
		t.Errorf("a synchronised match must carry \"error\":\"\": %s", out)
	}
	if empty := appendMatches(nil, nil); string(empty) != "[]" {
		t.Errorf("no matches encode as %s", empty)
	}
}

func TestAppendError(t *testing.T) {
	out := appendError(nil, 400, `token_ids[3]: must be an integer in [0, 4294967295], got "x"`)
	var eb errorBody
	if err := json.Unmarshal(out, &eb); err != nil {
		t.Fatal(err)
	}
	if eb.Error.Code != 400 || eb.Error.Message != `token_ids[3]: must be an integer in [0, 4294967295], got "x"` {
		t.Fatalf("%s", out)
	}
}
