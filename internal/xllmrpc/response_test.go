package xllmrpc

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/kvcar/kvcar/internal/xllmpb"
)

func ptr[T any](v T) *T { return &v }

// checkResponse holds appendResponse to encoding/json: the same JSON
// value always, and the same bytes when no string needs an escape the
// two write differently (encoding/json also escapes <, > and &).
func checkResponse(t *testing.T, r *responseJSON, sameBytes bool) {
	t.Helper()
	ours := appendResponse(nil, r)
	std, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(ours) {
		t.Fatalf("invalid JSON %s", ours)
	}
	if sameBytes && !bytes.Equal(ours, std) {
		t.Fatalf("wrote\n%s\nencoding/json writes\n%s", ours, std)
	}
	var a, b any
	if err := json.Unmarshal(ours, &a); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(std, &b); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("wrote\n%s\nencoding/json writes\n%s", ours, std)
	}
}

// Every shape the responder writes: the streamed chat's role, text and
// finish chunks, a text completion's chunks, the usage chunk with no
// choices, and whole bodies of several choices with cached tokens.
func TestAppendResponseAsEncodingJSON(t *testing.T) {
	base := responseJSON{ID: "chatcmpl-1", Object: "chat.completion.chunk", Created: 1733366400, Model: "Qwen3-8B"}
	with := func(choices []choiceJSON, u *usageJSON) *responseJSON {
		r := base
		r.Choices, r.Usage = choices, u
		return &r
	}
	for _, tc := range []struct {
		name      string
		r         *responseJSON
		sameBytes bool
	}{
		{"role", with([]choiceJSON{{Delta: &messageJSON{Role: "assistant", Content: ptr("")}}}, nil), true},
		{"chat delta", with([]choiceJSON{{Index: 1, Delta: &messageJSON{Content: ptr(" world")}}}, nil), true},
		{"chat finish", with([]choiceJSON{{Delta: &messageJSON{}, FinishReason: ptr("stop")}}, nil), true},
		{"text", with([]choiceJSON{{Text: ptr("tab\there \"quoted\" \\ é中😀")}}, nil), true},
		{"text finish", with([]choiceJSON{{Text: ptr(""), FinishReason: ptr("length")}}, nil), true},
		{"usage", with([]choiceJSON{}, &usageJSON{PromptTokens: 2048, CompletionTokens: 16, TotalTokens: 2064}), true},
		{"cached", with([]choiceJSON{}, &usageJSON{PromptTokens: 8, CompletionTokens: 1, TotalTokens: 9,
			PromptTokensDetails: &promptTokensDetails{CachedTokens: 4}}), true},
		{"whole", with([]choiceJSON{
			{Message: &messageJSON{Role: "assistant", Content: ptr("a")}, FinishReason: ptr("stop")},
			{Index: 1, Message: &messageJSON{Role: "assistant", Content: ptr("b\nc")}, FinishReason: ptr("length")},
		}, &usageJSON{PromptTokens: 1, CompletionTokens: 2, TotalTokens: 3}), true},
		{"escapes", with([]choiceJSON{{Text: ptr("<b>&\u2028\x00\b\f\x7f"), FinishReason: ptr("\xff")}}, nil), false},
		{"no choices", with(nil, nil), false}, // encoding/json writes null; kvcar always sends []
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.r.Choices == nil {
				if got := appendResponse(nil, tc.r); !bytes.Contains(got, []byte(`"choices":[]`)) {
					t.Fatalf("no choices written as %s", got)
				}
				return
			}
			checkResponse(t, tc.r, tc.sameBytes)
		})
	}
}

// FuzzAppendResponse: whatever text, id and finish reason an engine
// sends, the response is valid JSON with the values encoding/json would
// write.
func FuzzAppendResponse(f *testing.F) {
	f.Add("cmpl-1", "Hello", "stop", int32(0), true)
	f.Add("\xff", "<\u2029>", "", int32(-1), false)
	f.Fuzz(func(t *testing.T, id, text, finish string, index int32, chat bool) {
		c := choiceJSON{Index: index, Text: &text}
		if chat {
			c = choiceJSON{Index: index, Delta: &messageJSON{Role: finish, Content: &text}}
		}
		if finish != "" {
			c.FinishReason = &finish
		}
		checkResponse(t, &responseJSON{ID: id, Object: "text_completion", Model: text, Choices: []choiceJSON{c}}, false)
	})
}

// flushCounter counts the flushes of a response.
type flushCounter struct {
	*httptest.ResponseRecorder
	flushes int
}

func (f *flushCounter) Flush() {
	f.flushes++
	f.ResponseRecorder.Flush()
}

// Generations that queued up while the client's goroutine was busy are
// written as their events, in order, and flushed together: one write to
// the client for all of them, not one each.
func TestQueuedGenerationsFlushedTogether(t *testing.T) {
	d := testDispatcher(t)
	q, err := d.opts.Outputs.open("r")
	if err != nil {
		t.Fatal(err)
	}
	defer d.opts.Outputs.close("r", q)
	for i, text := range []string{"a", "b", "c", ""} {
		g := &xllmpb.DisaggStreamGeneration{ReqId: "cmpl-1", ServiceReqId: "r",
			Outputs: []*xllmpb.SequenceOutput{{Text: text}}, Finished: i == 3}
		if i == 3 {
			g.Outputs[0].FinishReason = "length"
		}
		if !d.opts.Outputs.Deliver(g) {
			t.Fatal("generation refused")
		}
	}
	w := &flushCounter{ResponseRecorder: httptest.NewRecorder()}
	out := newResponder(w, &parsedRequest{stream: true, model: "m"}, 1)
	if err := d.collect(t.Context(), Request{Prefill: "p"}, "r", q, nil, out); err != nil {
		t.Fatal(err)
	}
	body := w.Body.String()
	var texts []string
	for ev := range strings.SplitSeq(strings.TrimSpace(body), "\n\n") {
		data := strings.TrimPrefix(ev, "data: ")
		if data == "[DONE]" {
			texts = append(texts, data)
			continue
		}
		var r struct {
			Choices []struct{ Text string } `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &r); err != nil || len(r.Choices) != 1 {
			t.Fatalf("event %q: %v", ev, err)
		}
		texts = append(texts, r.Choices[0].Text)
	}
	if got := strings.Join(texts, "|"); got != "a|b|c||[DONE]" || w.flushes != 1 {
		t.Fatalf("events %s in %d flushes, want a|b|c||[DONE] in 1:\n%s", got, w.flushes, body)
	}
}
