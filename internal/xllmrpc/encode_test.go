package xllmrpc

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kvcar/kvcar/internal/baidustd"
	"github.com/kvcar/kvcar/internal/xllmpb"
)

func testDispatcher(t *testing.T) *Dispatcher {
	t.Helper()
	d, err := NewDispatcher(DispatcherOptions{Self: "127.0.0.1:8889", Outputs: NewOutputs(0, 0)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// The Completions request kvcar writes is byte for byte the one
// xllm-service wrote in the recording between real brpc peers
// (completions.req.bin): the client's fields, the prompt, the token ids
// packed, the routing and source_xservice_addr, in field order.
func TestEncodeMatchesRecordedCompletions(t *testing.T) {
	d := testDispatcher(t)
	enc := new(encoder)
	_, err := d.build(Request{Body: []byte(`{"model":"fake-model","prompt":"hello","max_tokens":2}`), TokenIDs: []uint32{1, 2, 3, 4},
		Prefill: "127.0.0.1:18000"}, "svc-1", enc)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"brpc-1.12.1", "brpc-1.17.0"} {
		f, _, err := baidustd.ParseFrame(golden(t, v, "completions.req.bin"), baidustd.DefaultMaxBodySize)
		if err != nil {
			t.Fatal(err)
		}
		want, _, _ := f.Parts()
		if !bytes.Equal(enc.msg, want) {
			t.Errorf("%s: message\n got %x\nwant %x", v, enc.msg, want)
		}
	}
}

// Every request the encoder writes is exactly what the generated code
// writes for the whole message built field by field, whether the caller
// brings the prompt it read (spans into the body) or the dispatcher reads
// it itself.
func TestEncodeEqualsGeneratedCode(t *testing.T) {
	d := testDispatcher(t)
	self, id := "127.0.0.1:8889", "svc-9"
	routing := &xllmpb.Routing{PrefillName: "10.0.0.1:8000", DecodeName: "10.0.0.2:8000"}
	for _, tc := range []struct {
		name string
		chat bool
		body string
		ids  []uint32
		want proto.Message
	}{
		{name: "text", body: `{"model":"m","prompt":"héllo\nworld","max_tokens":7,"stream":true,"stop":["a","b"],"routing":{"prefill_name":"x"}}`,
			want: &xllmpb.CompletionRequest{Model: "m", Prompt: "héllo\nworld", MaxTokens: ptr[uint32](7), Stream: ptr(true), Stop: []string{"a", "b"}}},
		{name: "text with kvcar's ids", body: `{"prompt":"a b","temperature":0.5}`, ids: []uint32{5, 1 << 20, 1<<31 - 1},
			want: &xllmpb.CompletionRequest{Prompt: "a b", Temperature: proto.Float32(0.5), TokenIds: []int32{5, 1 << 20, 1<<31 - 1}}},
		{name: "ids", body: `{"model":"m","prompt":[3,300,70000],"echo":false,"stream_options":{"include_usage":true}}`,
			want: &xllmpb.CompletionRequest{Model: "m", Echo: ptr(false), TokenIds: []int32{3, 300, 70000},
				StreamOptions: &xllmpb.StreamOptions{IncludeUsage: ptr(true)}}},
		{name: "one-prompt batch", body: `{"prompt":[[9,8]],"user":"u"}`,
			want: &xllmpb.CompletionRequest{User: "u", TokenIds: []int32{9, 8}}},
		{name: "chat", chat: true, body: `{"model":"m","max_completion_tokens":3,"messages":[{"role":"system","content":"be brief"},` +
			`{"role":"user","content":[{"type":"text","text":"one"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"two"}]},` +
			`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},` +
			`{"role":"tool","content":"42","tool_call_id":"c1","name":"f"}],` +
			`"tools":[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object","b":1,"a":[true]}}}],` +
			`"tool_choice":"auto","chat_template_kwargs":{"enable_thinking":false,"z":"y"},"response_format":{"type":"json_object"}}`,
			// kvcar's ids are rendered from roles and contents alone: with
			// tools or tool calls the engine renders the chat itself.
			ids: []uint32{1, 2, 3},
			want: &xllmpb.ChatRequest{Model: "m", MaxTokens: ptr[uint32](3), ToolChoice: ptr("auto"),
				ResponseFormat: &xllmpb.ResponseFormat{Type: ptr("json_object")},
				Messages: []*xllmpb.ChatMessage{
					{Role: ptr("system"), Content: ptr("be brief")},
					{Role: ptr("user"), Content: ptr("one\ntwo")},
					{Role: ptr("assistant"), Content: ptr(""), ToolCalls: []*xllmpb.ToolCall{{Id: ptr("c1"), Type: "function",
						Function: &xllmpb.FunctionCall{Name: "f", Arguments: "{}"}}}},
					{Role: ptr("tool"), Content: ptr("42"), ToolCallId: ptr("c1")},
				}}},
		{name: "plain chat with kvcar's ids", chat: true, ids: []uint32{7, 8},
			body: `{"messages":[{"role":"user","content":"hi"}],"stream":true,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"none"}`,
			want: &xllmpb.ChatRequest{Stream: ptr(true), TokenIds: []int32{7, 8}, ToolChoice: ptr("none"),
				Messages: []*xllmpb.ChatMessage{{Role: ptr("user"), Content: ptr("hi")}}}},
		{name: "chat with template arguments", chat: true, ids: []uint32{7, 8},
			body: `{"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"enable_thinking":false}}`,
			want: &xllmpb.ChatRequest{Messages: []*xllmpb.ChatMessage{{Role: ptr("user"), Content: ptr("hi")}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The tools and kwargs come from the mapping shared by both
			// ways; the rest of want is written out above.
			if c, ok := tc.want.(*xllmpb.ChatRequest); ok {
				full, _, err := chatMessage([]byte(tc.body))
				if err != nil {
					t.Fatal(err)
				}
				c.Tools, c.ChatTemplateKwargs = full.Tools, full.ChatTemplateKwargs
				c.ServiceRequestId, c.Routing, c.SourceXserviceAddr = &id, routing, &self
			} else {
				c := tc.want.(*xllmpb.CompletionRequest)
				c.ServiceRequestId, c.Routing, c.SourceXserviceAddr = &id, routing, &self
			}
			want, err := marshal.Marshal(tc.want)
			if err != nil {
				t.Fatal(err)
			}
			enc := new(encoder)
			if _, err := d.build(Request{Chat: tc.chat, Body: []byte(tc.body), TokenIDs: tc.ids, Prefill: routing.PrefillName,
				Decode: routing.DecodeName}, id, enc); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(enc.msg, want) {
				got := tc.want.ProtoReflect().New().Interface()
				_ = proto.Unmarshal(enc.msg, got)
				t.Fatalf("encoded\n %x\nwant\n %x\ndecoded %v\nwant    %v", enc.msg, want, got, tc.want)
			}
		})
	}
}

// What cannot be sent is refused with 400 naming the problem.
func TestEncodeRefusals(t *testing.T) {
	d := testDispatcher(t)
	for _, tc := range []struct {
		chat       bool
		body, want string
		ids        []uint32
	}{
		{false, `{"prompt":["a","b"]}`, "prompt holds 2 prompts: send one per request", nil},
		{false, `{"prompt":[]}`, "prompt is empty", nil},
		{false, `{"prompt":""}`, "prompt is empty", nil},
		{false, `{"model":"m"}`, "prompt is required", nil},
		{false, `{"prompt":12}`, "prompt must be a string", nil},
		{false, `{"prompt":"x","max_tokens":"many"}`, "invalid JSON body", nil},
		{false, `{"prompt":"x"}`, "token id 2147483648 does not fit", []uint32{1, 1 << 31}},
		{true, `{"messages":[]}`, "messages is required", nil},
		{true, `{"messages":[{"content":"x"}]}`, "messages[0].role is required", nil},
		{true, `{"messages":[{"role":"user","content":5}]}`, "messages[0].content", nil},
		{true, `{"messages":[{"role":"user","content":"x","tool_calls":"no"}]}`, "messages[0]:", nil},
	} {
		_, err := d.build(Request{Chat: tc.chat, Body: []byte(tc.body), TokenIDs: tc.ids, Prefill: "10.0.0.1:1"}, "id", new(encoder))
		var bad *BadRequestError
		if !errors.As(err, &bad) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a bad request with %q", tc.body, err, tc.want)
		}
	}
}

// The packed token ids are the bytes protowire's own varints make, for
// ids of every width (the edges of each and random ones), after other
// bytes and into buffers of every spare capacity; arrays of 16 ids or
// more go through packIDs where the processor has AVX-512 (every
// sixteen), and the rest one by one.
func TestPackedIDsMatchProtowire(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 7))
	edges := []uint32{0, 1, 1<<7 - 1, 1 << 7, 1<<14 - 1, 1 << 14, 1<<21 - 1, 1 << 21, 1<<28 - 1, 1 << 28, math.MaxInt32}
	for iter := range 3000 {
		// Arrays of ids below 2^21 (every vocabulary's, written three
		// bytes at most in one pass), of ids below 2^7 (whose length
		// takes fewer bytes than the room left for it), and of ids of
		// every width.
		ids := make([]uint32, rng.IntN(300))
		for i := range ids {
			switch kind := rng.IntN(3); iter % 3 {
			case 0:
				if kind == 0 {
					ids[i] = edges[rng.IntN(8)]
				} else {
					ids[i] = uint32(rng.IntN(151_936))
				}
			case 1:
				ids[i] = uint32(rng.IntN(128))
			default:
				switch kind {
				case 0:
					ids[i] = edges[rng.IntN(len(edges))]
				case 1:
					ids[i] = uint32(rng.IntN(151_936))
				default:
					ids[i] = uint32(rng.Int64N(math.MaxInt32 + 1))
				}
			}
		}
		head := bytes.Repeat([]byte{0xee}, rng.IntN(20))
		want := head
		if len(ids) > 0 {
			var packed []byte
			for _, id := range ids {
				packed = protowire.AppendVarint(packed, uint64(id))
			}
			want = protowire.AppendTag(want, completionTokenIDsField, protowire.BytesType)
			want = protowire.AppendBytes(want, packed)
		}
		dst := append(make([]byte, 0, len(head)+rng.IntN(2*len(want)+1)), head...)
		if got := appendPackedIDs(dst, completionTokenIDsField, ids); !bytes.Equal(got, want) {
			t.Fatalf("iteration %d, ids %v:\n got %x\nwant %x", iter, ids, got, want)
		}
	}
}
