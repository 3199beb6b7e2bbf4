package kvevent

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tinylib/msgp/msgp"
)

// The golden corpus lives in testdata/golden as pairs NAME.hex (the
// payload as hex; '#' starts a comment, whitespace is ignored) and
// NAME.json (the expected decode or error).
//
//   - hand_*: written byte by byte from the MessagePack specification
//     and edited by hand, so the decoder is checked against something
//     other than its own encoder. -update never touches them.
//   - gen_*, bad_*: written by `go test ./internal/kvevent -run TestGolden
//     -update` from goldenCases below. Their expectations come from the
//     batch that was encoded (or the fault that was planted), never from
//     the decoder.
var update = flag.Bool("update", false, "rewrite the generated golden files under testdata/golden")

const goldenDir = "testdata/golden"

type goldenExpect struct {
	// MaxMessageBytes is the decoder limit for this case; 0 is the default.
	MaxMessageBytes int        `json:"max_message_bytes,omitempty"`
	Batch           *batchView `json:"batch,omitempty"`
	// Error is a substring of the expected error; TooLarge selects
	// ErrTooLarge instead of ErrMalformed.
	Error    string `json:"error,omitempty"`
	TooLarge bool   `json:"too_large,omitempty"`
}

type goldenCase struct {
	name    string
	comment string
	payload []byte
	expect  goldenExpect
}

func expectBatch(b *Batch) goldenExpect {
	v := viewOf(b)
	return goldenExpect{Batch: &v}
}

func withoutRank(b *Batch) *Batch {
	c := b.Clone()
	c.HasDPRank, c.DPRank = false, 0
	return c
}

// badEvent wraps one raw event in a padded 4-element batch (see oneEvent).
func badEvent(name, comment, want string, ev ...byte) goldenCase {
	return goldenCase{name: name, comment: comment, payload: oneEvent(ev...), expect: goldenExpect{Error: want}}
}

func goldenCases() []goldenCase {
	sample := sampleBatch()
	var cs []goldenCase
	enc := func(name, comment string, b *Batch, s Shape) {
		cs = append(cs, goldenCase{name: name, comment: comment, payload: AppendBatch(nil, b, s), expect: expectBatch(decodedAs(b, s))})
	}
	enc("gen_array_batch_map_events", "R-WIRE-2 [ts, events, dp_rank] with tagged-map events, uint64 hashes incl. >= 2^63", sample, Shape{})
	enc("gen_array_batch_array_events", "R-WIRE-2 tagged-array events", sample, Shape{EventsAsArrays: true})
	enc("gen_map_batch_map_events", "R-WIRE-2 {ts, events, data_parallel_rank}", sample, Shape{BatchAsMap: true})
	enc("gen_map_batch_array_events_int64", "R-WIRE-2 map batch, array events, signed int64 hashes (negative patterns)", sample,
		Shape{BatchAsMap: true, EventsAsArrays: true, Hashes: HashInt64})
	enc("gen_bytes8_hashes", "8-byte bin hashes read big-endian (BytesHash)", sample, Shape{Hashes: HashBytes8})
	enc("gen_upper_medium", "medium GPU/CPU", sample, Shape{UpperMedium: true})
	enc("gen_two_element_batch", "[ts, events] without dp_rank", sample, Shape{OmitDPRank: true})
	enc("gen_map_batch_without_rank", "map batch without data_parallel_rank", sample, Shape{BatchAsMap: true, OmitDPRank: true})
	enc("gen_nil_dp_rank", "dp_rank nil", withoutRank(sample), Shape{})

	replica := &Batch{Timestamp: 10, HasDPRank: true}
	replica.AddStored(ints(math.MaxUint64, 1), EngineHash{}, false, nil, 0, Host)
	enc("gen_tokenless_replica", "Host copy announced by hash only: token_ids=[], block_size=0, medium cpu", replica, Shape{})

	full := &Batch{Timestamp: 11, HasDPRank: true, DPRank: 2}
	full.AddCleared()
	full.AddStored(ints(100, 101), EngineHash{}, false, []uint32{1, 2, 3, 4}, 2, Device)
	full.AddStored(ints(102), IntHash(101), true, []uint32{5, 6}, 2, Device)
	full.AddStored(ints(100), EngineHash{}, false, nil, 0, Host)
	enc("gen_full_state", "R-WIRE-4 AllBlocksCleared followed by the full set of BlockStored", full, Shape{EventsAsArrays: true})

	lora := &Batch{Timestamp: 12}
	lora.AddStored(ints(7), EngineHash{}, false, []uint32{1, 2}, 2, Device)
	lora.Events[0].PlainText = false
	enc("gen_lora_non_plain", "R-WIRE-5 lora_id set: not plain text", lora, Shape{})

	good := AppendBatch(nil, sample, Shape{})
	cs = append(cs,
		goldenCase{name: "bad_too_large", comment: "payload one byte over max_message_bytes", payload: good,
			expect: goldenExpect{MaxMessageBytes: len(good) - 1, TooLarge: true, Error: "exceeds the limit"}},
		goldenCase{name: "bad_truncated_last_byte", comment: "dp_rank cut off", payload: good[:len(good)-1],
			expect: goldenExpect{Error: "data_parallel_rank: expected int, got end of message"}},
		goldenCase{name: "bad_trailing_byte", comment: "a byte after the batch", payload: append(slices.Clip(good), 0xc0),
			expect: goldenExpect{Error: "1 trailing bytes after the batch"}},
	)

	mismatch := &Batch{}
	mismatch.AddStored(ints(1, 2), EngineHash{}, false, []uint32{1, 2, 3}, 2, Device)
	cs = append(cs, goldenCase{name: "bad_len_mismatch", comment: "3 tokens for 2 blocks of 2",
		payload: AppendBatch(nil, mismatch, Shape{}), expect: goldenExpect{Error: "event 0: token_ids: 3 tokens for 2 blocks of 2"}})

	zeroBS := &Batch{}
	zeroBS.AddStored(ints(1), EngineHash{}, false, []uint32{1, 2}, 0, Device)
	cs = append(cs, goldenCase{name: "bad_zero_block_size", comment: "tokens with block_size 0",
		payload: AppendBatch(nil, zeroBS, Shape{EventsAsArrays: true}), expect: goldenExpect{Error: "event 0: block_size: 0 with 2 tokens"}})

	stored := []byte{0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd'}
	arr := func(n byte, parts ...[]byte) []byte {
		out := []byte{0x90 | n}
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	cs = append(cs,
		badEvent("bad_token_above_uint32", "token id 2^32", "event 0: token_ids[0]: 4294967296 out of range",
			arr(4, stored, []byte{0x91, 0x01}, []byte{0xc0}, []byte{0x91, 0xcf, 0, 0, 0, 1, 0, 0, 0, 0})...),
		badEvent("bad_token_negative", "token id -1", "event 0: token_ids[0]: -1 out of range",
			arr(4, stored, []byte{0x91, 0x01}, []byte{0xc0}, []byte{0x91, 0xff})...),
		badEvent("bad_token_str", "token id as str", "event 0: token_ids[0]: expected int, got str",
			arr(4, stored, []byte{0x91, 0x01}, []byte{0xc0}, []byte{0x91, 0xa1, '1'})...),
		badEvent("bad_unknown_type", "type BlockMoved", `event 0: type: unknown event type "BlockMoved"`,
			arr(1, []byte{0xaa, 'B', 'l', 'o', 'c', 'k', 'M', 'o', 'v', 'e', 'd'})...),
		badEvent("bad_medium_type", "medium as int", "event 0: medium: expected str or nil, got int",
			arr(7, stored, []byte{0x90, 0xc0, 0x90, 0x00, 0xc0, 0x01})...),
		badEvent("bad_hash_type", "a hash as float", "event 0: block_hashes[0]: expected int or bytes, got float64",
			arr(2, stored, msgp.AppendFloat64([]byte{0x91}, 1))...),
		badEvent("bad_parent_type", "parent as array", "event 0: parent_block_hash: expected int or bytes, got array",
			arr(3, stored, []byte{0x90, 0x90})...),
		badEvent("bad_block_size_negative", "block_size -1", "event 0: block_size: -1 out of range",
			arr(5, stored, []byte{0x90, 0xc0, 0x90, 0xff})...),
		badEvent("bad_hashes_claim", "block_hashes claims 2^32-1 elements", "event 0: block_hashes: array claims 4294967295 elements",
			arr(2, stored, []byte{0xdd, 0xff, 0xff, 0xff, 0xff})...),
		badEvent("bad_tokens_claim", "token_ids claims 65535 elements", "event 0: token_ids: array claims 65535 elements",
			arr(4, stored, []byte{0x90, 0xc0, 0xdc, 0xff, 0xff})...),
		badEvent("bad_skipped_value_claim", "an unknown key's bin32 value claims 4 GiB", "event 0: x: msgp: too few bytes",
			0x81, 0xa1, 'x', 0xc6, 0xff, 0xff, 0xff, 0xff),
		goldenCase{name: "bad_events_claim", comment: "events claims 2^32-1 elements",
			payload: []byte{0x92, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff}, expect: goldenExpect{Error: "events: array claims 4294967295 elements"}},
		goldenCase{name: "bad_ts_type", comment: "ts as str",
			payload: []byte{0x92, 0xa1, 'x', 0x90}, expect: goldenExpect{Error: "ts: expected number, got str"}},
	)
	unknownMedium := &Batch{HasDPRank: true}
	unknownMedium.AddStored(nil, EngineHash{}, false, nil, 0, OtherMedium)
	cs = append(cs, goldenCase{name: "gen_unknown_medium", comment: "medium tpu: an unknown tier, decoded and never a hit",
		payload: oneEvent(arr(7, stored, []byte{0x90, 0xc0, 0x90, 0x00, 0xc0, 0xa3, 't', 'p', 'u'})...), expect: expectBatch(unknownMedium)})
	return cs
}

// formatHex writes payload as commented hex, 16 bytes a line.
func formatHex(comment string, payload []byte) []byte {
	var out bytes.Buffer
	fmt.Fprintf(&out, "# %s\n", comment)
	for len(payload) > 0 {
		n := min(16, len(payload))
		for i, c := range payload[:n] {
			if i > 0 {
				out.WriteByte(' ')
			}
			fmt.Fprintf(&out, "%02x", c)
		}
		out.WriteByte('\n')
		payload = payload[n:]
	}
	return out.Bytes()
}

func parseHex(text []byte) ([]byte, error) {
	var digits strings.Builder
	for line := range strings.SplitSeq(string(text), "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		digits.WriteString(strings.Join(strings.Fields(line), ""))
	}
	return hex.DecodeString(digits.String())
}

func writeGolden(t *testing.T) {
	t.Helper()
	if err := os.MkdirAll(goldenDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range goldenCases() {
		js, err := json.MarshalIndent(c.expect, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		base := filepath.Join(goldenDir, c.name)
		if err := os.WriteFile(base+".hex", formatHex(c.comment, c.payload), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(base+".json", append(js, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

type goldenFile struct {
	name    string
	payload []byte
	expect  goldenExpect
}

func readGolden(t testing.TB) []goldenFile {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(goldenDir, "*.hex"))
	if err != nil {
		t.Fatal(err)
	}
	var out []goldenFile
	for _, p := range paths {
		text, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		payload, err := parseHex(text)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		js, err := os.ReadFile(strings.TrimSuffix(p, ".hex") + ".json")
		if err != nil {
			t.Fatalf("%s: expected decode: %v", p, err)
		}
		var e goldenExpect
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if (e.Batch == nil) == (e.Error == "") {
			t.Fatalf("%s: expect exactly one of batch and error", p)
		}
		out = append(out, goldenFile{name: strings.TrimSuffix(filepath.Base(p), ".hex"), payload: payload, expect: e})
	}
	return out
}

// TestGolden decodes every file of the corpus and compares the result
// with its expected JSON (R-WIRE-2, R-WIRE-4, R-WIRE-5 and the bounds).
func TestGolden(t *testing.T) {
	if *update {
		writeGolden(t)
	}
	files := readGolden(t)
	if len(files) < len(goldenCases()) {
		t.Fatalf("%d golden files, want at least %d: run with -update", len(files), len(goldenCases()))
	}
	for _, f := range files {
		t.Run(f.name, func(t *testing.T) {
			var b Batch
			err := NewDecoder(f.expect.MaxMessageBytes).DecodeBatch(f.payload, &b)
			if f.expect.Error != "" {
				sentinel := ErrMalformed
				if f.expect.TooLarge {
					sentinel = ErrTooLarge
				}
				if !errors.Is(err, sentinel) || !strings.Contains(err.Error(), f.expect.Error) {
					t.Fatalf("got error %v, want %v containing %q", err, sentinel, f.expect.Error)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, _ := json.Marshal(viewOf(&b))
			want, _ := json.Marshal(f.expect.Batch)
			if !bytes.Equal(got, want) {
				t.Fatalf("\n got %s\nwant %s", got, want)
			}
		})
	}
}

// The generated files match what the generator would write now, so the
// encoder's output is pinned byte for byte.
func TestGoldenUpToDate(t *testing.T) {
	for _, c := range goldenCases() {
		text, err := os.ReadFile(filepath.Join(goldenDir, c.name+".hex"))
		if err != nil {
			t.Fatalf("%s: %v (run with -update)", c.name, err)
		}
		payload, err := parseHex(text)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(payload, c.payload) {
			t.Errorf("%s: file differs from the generator (run with -update and review the diff)", c.name)
		}
	}
}
