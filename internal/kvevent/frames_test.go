package kvevent

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func seq8(v uint64) []byte { return seqFrame(v) }

// R-WIRE-1: the live envelope is exactly topic | seq (8-byte BE) | payload.
func TestParseLive_RWIRE1(t *testing.T) {
	topic, seq, payload, err := ParseLive(LiveFrames("xllm-kv", 0x0102030405060708, []byte{0x93}))
	if err != nil {
		t.Fatal(err)
	}
	if string(topic) != "xllm-kv" || seq != 0x0102030405060708 || !bytes.Equal(payload, []byte{0x93}) {
		t.Fatalf("got topic %q seq %#x payload %x", topic, seq, payload)
	}
	raw := [][]byte{[]byte("t"), {0, 0, 0, 0, 0, 0, 1, 0}, []byte("p")}
	if _, seq, _, err = ParseLive(raw); err != nil || seq != 256 {
		t.Fatalf("big-endian seq: got %d, %v", seq, err)
	}

	bad := []struct {
		name   string
		frames [][]byte
		want   string
	}{
		{"two frames", [][]byte{[]byte("t"), seq8(1)}, "got 2 frames"},
		{"four frames", [][]byte{[]byte("t"), seq8(1), {1}, {2}}, "got 4 frames"},
		{"short seq", [][]byte{[]byte("t"), {1, 2, 3}, {1}}, "sequence frame is 3 bytes"},
		{"long seq", [][]byte{[]byte("t"), make([]byte, 9), {1}}, "sequence frame is 9 bytes"},
	}
	for _, tc := range bad {
		_, _, _, err := ParseLive(tc.frames)
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want ErrMalformed containing %q", tc.name, err, tc.want)
		}
	}
}

// R-WIRE-3: replay replies with and without a topic frame, and the end
// marker, as a DEALER receives them.
func TestParseReplay_RWIRE3(t *testing.T) {
	payload := []byte{0x92, 0x00, 0x90}
	cases := []struct {
		name    string
		frames  [][]byte
		seq     uint64
		payload []byte
		end     bool
	}{
		{"three frames", ReplayFrames(42, payload), 42, payload, false},
		{"with topic", [][]byte{{}, []byte("xllm-kv"), seq8(7), payload}, 7, payload, false},
		{"end marker", ReplayEnd(), ReplayEndSeq, nil, true},
		{"end marker with topic", [][]byte{{}, []byte("xllm-kv"), seq8(ReplayEndSeq), {}}, ReplayEndSeq, nil, true},
		// Item 12: vLLM >= 0.26 frames, built by their own builders and
		// spelled out.
		{"vllm topic reply", ReplayFramesTopic("kv@pod-1@m", 9, payload), 9, payload, false},
		{"vllm end marker", ReplayEndTopic(), ReplayEndSeq, nil, true},
		{"vllm end marker spelled out", [][]byte{{}, {}, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, {}}, ReplayEndSeq, nil, true},
		{"older end marker spelled out", [][]byte{{}, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, {}}, ReplayEndSeq, nil, true},
	}
	for _, tc := range cases {
		topic, hasTopic := ReplayTopic(tc.frames)
		if hasTopic != (len(tc.frames) == 4) || (hasTopic && !bytes.Equal(topic, tc.frames[1])) {
			t.Errorf("%s: topic %q %v", tc.name, topic, hasTopic)
		}
		seq, p, end, err := ParseReplay(tc.frames)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if seq != tc.seq || end != tc.end || !bytes.Equal(p, tc.payload) {
			t.Errorf("%s: got seq %d end %v payload %x", tc.name, seq, end, p)
		}
	}

	bad := []struct {
		name   string
		frames [][]byte
		want   string
	}{
		{"no delimiter", [][]byte{{1}, seq8(1), payload}, "empty delimiter"},
		{"two frames", [][]byte{{}, seq8(1)}, "got 2 frames"},
		{"five frames", [][]byte{{}, {}, {}, seq8(1), payload}, "got 5 frames"},
		{"short seq", [][]byte{{}, {1}, payload}, "sequence frame is 1 bytes"},
		{"end with payload", [][]byte{{}, seq8(ReplayEndSeq), {1}}, "end marker carries"},
		{"empty payload", [][]byte{{}, seq8(3), {}}, "empty payload"},
	}
	for _, tc := range bad {
		_, _, _, err := ParseReplay(tc.frames)
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want ErrMalformed containing %q", tc.name, err, tc.want)
		}
	}
}

// R-WIRE-3: the request is [empty, start seq] on both sides.
func TestReplayRequest_RWIRE3(t *testing.T) {
	for _, start := range []uint64{0, 1, 1 << 40, ReplayEndSeq - 1} {
		req := ReplayRequest(start)
		if len(req) != 2 || len(req[0]) != 0 || len(req[1]) != 8 {
			t.Fatalf("request frames %x", req)
		}
		got, err := ParseReplayRequest(req)
		if err != nil || got != start {
			t.Fatalf("start %d: got %d, %v", start, got, err)
		}
	}
	for _, frames := range [][][]byte{
		{seq8(1)},
		{{1}, seq8(1)},
		{{}, {1, 2}},
		{{}, seq8(1), {}},
	} {
		if _, err := ParseReplayRequest(frames); !errors.Is(err, ErrMalformed) {
			t.Errorf("frames %x: got %v, want ErrMalformed", frames, err)
		}
	}
}
