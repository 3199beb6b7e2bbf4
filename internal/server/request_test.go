package server

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// chunkReader returns at most n bytes per Read, so that every token of
// a body crosses a read boundary somewhere.
type chunkReader struct {
	r io.Reader
	n int
}

func (c chunkReader) Read(p []byte) (int, error) { return c.r.Read(p[:min(len(p), c.n)]) }

// parseBody runs the single pass over body, read n bytes at a time,
// keeping text up to maxText bytes.
func parseBody(body []byte, chat bool, n, maxText int) (*inference, []byte, *requestError) {
	in := &inference{}
	in.reset()
	sc := scanner{r: chunkReader{bytes.NewReader(body), n}, limit: math.MaxInt32, keep: true}
	err := parseInference(&sc, in, chat, inferenceLimits{maxIDs: 1 << 20, keepText: maxText > 0, maxText: maxText})
	return in, sc.buf[:sc.end], err
}

// TestParseCompletionForms covers the prompt forms of /v1/completions:
// ids, text and batches of either (routed by the first), read in one
// pass with every other member only checked.
func TestParseCompletionForms(t *testing.T) {
	for _, tc := range []struct {
		body string
		ids  []uint32
		text string
		// value is the prompt's value as written; count the prompts in it.
		value string
		count int
	}{
		{`{"prompt":[1,2,3]}`, []uint32{1, 2, 3}, "", `[1,2,3]`, 1},
		{` { "model" : "m" , "prompt" : [ 0 , 4294967295 ] , "n" : [ {"a":[true,false,null,-1.5e+3]} ] } `, []uint32{0, 4294967295}, "",
			`[ 0 , 4294967295 ]`, 1},
		{`{"prompt":[]}`, []uint32{}, "", `[]`, 1},
		{`{"prompt":[[5,6],[7]]}`, []uint32{5, 6}, "", `[[5,6],[7]]`, 2},
		{`{"prompt":"hi \"there\"\n\u00e9\ud83d\ude00"}`, nil, "hi \"there\"\n\u00e9\U0001F600", `"hi \"there\"\n\u00e9\ud83d\ude00"`, 1},
		{`{"prompt":["first","second","third"],"x":1}`, nil, "first", `["first","second","third"]`, 3},
		// Lone surrogate halves decode to U+FFFD, as encoding/json does.
		{`{"prompt":"a\ud800b\udc00\ud800\ud800\udc00"}`, nil, "a\ufffdb\ufffd\ufffd\U00010000", `"a\ud800b\udc00\ud800\ud800\udc00"`, 1},
	} {
		for _, n := range []int{1, 3, 4096} {
			in, body, err := parseBody([]byte(tc.body), false, n, 1<<20)
			if err != nil {
				t.Fatalf("%s (reads of %d): %s", tc.body, n, err.message)
			}
			if !bytes.Equal(body, []byte(tc.body)) {
				t.Fatalf("%s: kept body %q", tc.body, body)
			}
			if tc.ids != nil && (!in.hasIDs || !slices.Equal(in.ids, tc.ids)) {
				t.Fatalf("%s: ids %v (%v), want %v", tc.body, in.ids, in.hasIDs, tc.ids)
			}
			if tc.ids == nil && (in.hasIDs || string(in.text) != tc.text) {
				t.Fatalf("%s: text %q, want %q", tc.body, in.text, tc.text)
			}
			if v := tc.body[in.promptStart:in.promptEnd]; v != tc.value || in.prompts != tc.count {
				t.Fatalf("%s: prompt value %q holding %d, want %q holding %d", tc.body, v, in.prompts, tc.value, tc.count)
			}
		}
	}
}

// TestParseChatForms covers messages: string, null and part-array
// contents, the text parts kept whatever the key order and joined one per
// line as xllm-service joins them, other parts dropped; the spans of the
// messages in the body, and which have members besides role and content.
func TestParseChatForms(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"system","content":"be brief"},` +
		`{"content":[{"text":"look: ","type":"text"},{"type":"image_url","image_url":{"url":"x"},"text":"no"},{"type":"text","text":"this"}],"role":"user"},` +
		`{"role":"assistant","content":null,"tool_calls":[]}]}`
	in, _, err := parseBody([]byte(body), true, 7, 1<<20)
	if err != nil {
		t.Fatal(err.message)
	}
	var got [][2]string
	for _, m := range in.msgs {
		got = append(got, [2]string{string(in.text[m.roleStart:m.roleEnd]), string(in.text[m.contentStart:m.contentEnd])})
	}
	want := [][2]string{{"system", "be brief"}, {"user", "look: \nthis"}, {"assistant", ""}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("messages %q, want %q", got, want)
	}
	if v := body[in.promptStart:in.promptEnd]; !strings.HasPrefix(v, `[{"role":"system"`) || !strings.HasSuffix(v, `[]}]`) {
		t.Fatalf("messages value %q", v)
	}
	for i, m := range in.msgs {
		obj := body[m.objStart:m.objEnd]
		if obj[0] != '{' || obj[len(obj)-1] != '}' || m.other != (i == 2) {
			t.Errorf("message %d: object %q, other members %v", i, obj, m.other)
		}
	}
	if in.textLen != len("be brief")+len("look: ")+len("this") {
		t.Fatalf("text length %d", in.textLen)
	}
}

// TestParseInferenceErrors covers R-API-5 on the request path: each bad
// body is refused naming what is wrong.
func TestParseInferenceErrors(t *testing.T) {
	deep := `{"prompt":[1],"x":` + strings.Repeat("[", maxDepth+1) + strings.Repeat("]", maxDepth+1) + `}`
	for _, tc := range []struct {
		body string
		chat bool
		want string
	}{
		{``, false, "request body is empty"},
		{`[1]`, false, "must be a JSON object, got an array"},
		{`{`, false, "unexpected end of body at offset 1"},
		{`{"model":"m"}`, false, "prompt: required"},
		{`{"prompt":[1,-5]}`, false, "prompt[1]: must be an integer in [0, 4294967295], got -5"},
		{`{"prompt":[[1,1.5]]}`, false, "prompt[0][1]: must be an integer"},
		{`{"prompt":{"a":1}}`, false, promptForms},
		{`{"prompt":null}`, false, promptForms},
		{`{"prompt":[1],"prompt":[2]}`, false, "prompt: given more than once"},
		{`{"prompt":[1],"routing":{},"routing":{}}`, false, "routing: given more than once"},
		{`{"prompt":[1]} x`, false, "unexpected data after the JSON object"},
		{`{"prompt":[1],"x":01}`, false, "unexpected character '1'"},
		{`{"prompt":[1],"x":1.}`, false, "unexpected character '}'"},
		{`{"prompt":[1],"x":-}`, false, "unexpected character '}'"},
		{`{"prompt":[1],"x":[1,]}`, false, "unexpected character ']'"},
		{`{"prompt":[1],"x":{"a" 1}}`, false, "unexpected character '1'"},
		{`{"prompt":[1],"x":tru}`, false, "unexpected character '}'"},
		{"{\"prompt\":\"a\x01\"}", false, "unexpected character"},
		{`{"prompt":"a\q"}`, false, "unexpected character 'q'"},
		{deep, false, "nested deeper than 10000"},
		{`{"messages":[]}`, true, "messages: must be a non-empty array"},
		{`{"model":"m"}`, true, "messages: must be a non-empty array"},
		{`{"messages":"hi"}`, true, "messages: must be a non-empty array, got a string"},
		{`{"messages":[1]}`, true, "messages[0]: must be an object, got a number"},
		{`{"messages":[{"role":1}]}`, true, "messages[0].role: must be a string, got a number"},
		{`{"messages":[{"content":"a"},{"content":7}]}`, true, "messages[1].content: must be a string, null or an array of content parts"},
		{`{"messages":[{"content":[{"type":"text"},"x"]}]}`, true, "messages[0].content[1]: must be an object, got a string"},
		{`{"messages":[{"content":[{"type":3}]}]}`, true, "messages[0].content[0].type: must be a string, got a number"},
	} {
		_, _, err := parseBody([]byte(tc.body), tc.chat, 5, 1<<20)
		if err == nil || err.status != 400 || !strings.Contains(err.message, tc.want) {
			t.Errorf("%.80s: %v, want 400 with %q", tc.body, err, tc.want)
		}
	}
}

// TestParseLimits covers the request path's limits (issue 10 item 1):
// prompt ids past MaxTokenIDs and text past the text limit are refused
// naming the limit, the text as soon as the limit is passed.
func TestParseLimits(t *testing.T) {
	in := &inference{}
	in.reset()
	body := `{"prompt":[1,2,3,4,5]}`
	sc := scanner{r: strings.NewReader(body), limit: 1 << 20, keep: true}
	if err := parseInference(&sc, in, false, inferenceLimits{maxIDs: 4}); err == nil || err.message != "prompt: more than 4 ids" {
		t.Errorf("ids over the limit: %v", err)
	}
	for _, tc := range []struct {
		body string
		chat bool
		want string
	}{
		{`{"prompt":"` + strings.Repeat("a", 11) + `"}`, false, "prompt: text exceeds 10 bytes"},
		{`{"prompt":["` + strings.Repeat("\\n", 11) + `"]}`, false, "prompt: text exceeds 10 bytes"},
		{`{"messages":[{"role":"user","content":"123456"},{"role":"user","content":[{"type":"text","text":"1"}]}]}`, true, "messages: text exceeds 10 bytes"},
	} {
		_, _, err := parseBody([]byte(tc.body), tc.chat, 3, 10)
		if err == nil || err.status != 413 || err.message != tc.want {
			t.Errorf("%s: %v, want 413 %q", tc.body, err, tc.want)
		}
		// Without a tokenizer the text is not kept, so not limited.
		if _, _, err := parseBody([]byte(tc.body), tc.chat, 3, 0); err != nil {
			t.Errorf("%s without keeping text: %v", tc.body, err)
		}
	}
	many := `{"messages":[` + strings.Repeat(`{},`, maxChatMessages) + `{}]}`
	if _, _, err := parseBody([]byte(many), true, 4096, 1<<20); err == nil || !strings.Contains(err.message, "more than 16384 messages") {
		t.Errorf("too many messages: %v", err)
	}
}

// FuzzInferenceRequest compares the single pass over a completion body
// with encoding/json. A body the pass accepts is valid JSON whose prompt
// decodes to the same ids or text, and whose "routing" value, replaced at
// the recorded offsets, leaves valid JSON with that member replaced; a
// body encoding/json reads as an object with one exactly-spelt "prompt"
// of ids or a string, and no repeated member, the pass accepts.
func FuzzInferenceRequest(f *testing.F) {
	for _, s := range []string{
		`{"prompt":[1,2,3]}`, `{"prompt":"hi","routing":{"prefill_name":"a"}}`, `{"routing":null,"prompt":[[1],[2]]}`,
		`{"prompt":["a","b"],"x":[1,{"y":"\u00e9"}]}`, `{"prompt":"\ud800\udc00"}`, `{"prompt":[01]}`, `{"prompt":[1e3]}`,
		`{"prompt":1}`, `{"PROMPT":[1]}`, `{"prompt":[1],"prompt":[2]}`, `{"prompt":[-0]}`, ` {"prompt" : [ ] } `,
		`{"prompt":[1],"x":-0.5E-7}`, `{"prompt":[1]}x`, `{"prompt":"a\\b\/c"}`,
	} {
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, body []byte, chunk uint8) {
		in, kept, perr := parseBody(body, false, 1+int(chunk)%64, 1<<20)
		if perr == nil && !bytes.Equal(kept, body) {
			t.Fatalf("%q: kept %q", body, kept)
		}
		var members map[string]json.RawMessage
		refErr := json.Unmarshal(body, &members)
		if perr != nil {
			if perr.status != 400 && perr.status != 413 {
				t.Fatalf("%q: unexpected rejection %d %q", body, perr.status, perr.message)
			}
			if refErr == nil && uniqueMembers(body) {
				var ids []uint32
				var text string
				raw, ok := members["prompt"]
				if ok && (json.Unmarshal(raw, &ids) == nil || json.Unmarshal(raw, &text) == nil) {
					t.Fatalf("rejected %q (%s); encoding/json reads its prompt", body, perr.message)
				}
			}
			return
		}
		if refErr != nil || members == nil {
			t.Fatalf("accepted %q, encoding/json: %v", body, refErr)
		}
		// A batch is routed by its first prompt; the rest is only checked.
		raw := members["prompt"]
		var batch []json.RawMessage
		if json.Unmarshal(raw, &batch) == nil && len(batch) > 0 && bytes.ContainsAny(batch[0][:1], `"[`) {
			raw = batch[0]
		}
		if in.hasIDs {
			var ref []int64
			if err := json.Unmarshal(raw, &ref); err != nil || len(ref) != len(in.ids) {
				t.Fatalf("%q: ids %v, encoding/json %v, %v", body, in.ids, ref, err)
			}
			for i, v := range ref {
				if int64(in.ids[i]) != v {
					t.Fatalf("%q: ids %v, encoding/json %v", body, in.ids, ref)
				}
			}
		} else if utf8.Valid(body) {
			var text string
			if err := json.Unmarshal(raw, &text); err != nil || text != string(in.text) {
				t.Fatalf("%q: text %q, encoding/json %q, %v", body, in.text, text, err)
			}
		}
		// The prompt's span is its value as encoding/json reads it, which
		// the dispatcher cuts out of the body.
		if v := body[in.promptStart:in.promptEnd]; !bytes.Equal(v, members["prompt"]) {
			t.Fatalf("%q: prompt value %q, encoding/json %q", body, v, members["prompt"])
		}
		if in.routingStart >= 0 {
			if !json.Valid(body[in.routingStart:in.routingEnd]) {
				t.Fatalf("%q: routing value %q is not a JSON value", body, body[in.routingStart:in.routingEnd])
			}
			spliced := append(append(append([]byte(nil), body[:in.routingStart]...), `{"x":1}`...), body[in.routingEnd:]...)
			var after map[string]json.RawMessage
			if err := json.Unmarshal(spliced, &after); err != nil || string(after["routing"]) != `{"x":1}` {
				t.Fatalf("%q spliced to %q: %v", body, spliced, err)
			}
		}
	})
}

// uniqueMembers reports whether no member of body's top-level object
// repeats.
func uniqueMembers(body []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return false
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		k, _ := tok.(string)
		if seen[k] {
			return false
		}
		seen[k] = true
		var raw json.RawMessage
		if dec.Decode(&raw) != nil {
			return false
		}
	}
	return true
}
