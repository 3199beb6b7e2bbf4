package xllmrpc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvcar/kvcar/internal/jsonw"
	"github.com/kvcar/kvcar/internal/xllmpb"
)

// The part of the OpenAI request bodies that maps onto xLLM's
// CompletionRequest and ChatRequest, field for field as xllm-service
// fills them. Members not listed are ignored, as by xllm-service.
type samplingJSON struct {
	Model             string          `json:"model"`
	MaxTokens         *uint32         `json:"max_tokens"`
	Temperature       *float32        `json:"temperature"`
	TopP              *float32        `json:"top_p"`
	TopK              *int64          `json:"top_k"`
	N                 *uint32         `json:"n"`
	BestOf            *uint32         `json:"best_of"`
	Stream            *bool           `json:"stream"`
	Stop              json.RawMessage `json:"stop"`
	StopTokenIDs      []int32         `json:"stop_token_ids"`
	PresencePenalty   *float32        `json:"presence_penalty"`
	FrequencyPenalty  *float32        `json:"frequency_penalty"`
	RepetitionPenalty *float32        `json:"repetition_penalty"`
	SkipSpecialTokens *bool           `json:"skip_special_tokens"`
	IgnoreEOS         *bool           `json:"ignore_eos"`
	User              string          `json:"user"`
	RequestID         *string         `json:"request_id"`
	StreamOptions     *struct {
		IncludeUsage *bool `json:"include_usage"`
	} `json:"stream_options"`
}

// completionFields are the members of a /v1/completions body besides
// its prompt.
type completionFields struct {
	samplingJSON
	Logprobs *uint32 `json:"logprobs"`
	Echo     *bool   `json:"echo"`
}

// chatFields are the members of a /v1/chat/completions body besides its
// messages.
type chatFields struct {
	samplingJSON
	MaxCompletionTokens *uint32         `json:"max_completion_tokens"`
	Logprobs            *bool           `json:"logprobs"`
	TopLogprobs         *int32          `json:"top_logprobs"`
	Tools               []toolJSON      `json:"tools"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	ChatTemplateKwargs  map[string]any  `json:"chat_template_kwargs"`
	ResponseFormat      *struct {
		Type *string `json:"type"`
	} `json:"response_format"`
}

// messageExtras are the members of a chat message besides its role and
// content.
type messageExtras struct {
	ReasoningContent *string `json:"reasoning_content"`
	ToolCallID       *string `json:"tool_call_id"`
	ToolCalls        []struct {
		ID       *string `json:"id"`
		Type     string  `json:"type"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

type toolJSON struct {
	Type     string `json:"type"`
	Function struct {
		Name        string         `json:"name"`
		Description string         `json:"description"`
		Parameters  map[string]any `json:"parameters"`
	} `json:"function"`
}

// BadRequestError is a request kvcar cannot send as it is: HTTP 400. Its
// text is about the client's body and names no engine.
type BadRequestError struct{ msg string }

func (e *BadRequestError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &BadRequestError{msg: fmt.Sprintf(format, args...)}
}

// parsedRequest is what answering a request needs to know of it once its
// xLLM message is sent.
type parsedRequest struct {
	chat         bool
	model        string
	stream       bool
	includeUsage bool
}

func decodeBody(body []byte, v any) error {
	if err := json.Unmarshal(body, v); err != nil {
		return badRequest("invalid JSON body: %v", err)
	}
	return nil
}

// stopList reads "stop": a string or an array of strings.
func stopList(raw json.RawMessage) ([]string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, badRequest("stop: %v", err)
		}
		return []string{s}, nil
	}
	var ss []string
	if err := json.Unmarshal(raw, &ss); err != nil {
		return nil, badRequest("stop must be a string or an array of strings")
	}
	return ss, nil
}

// completionMessage maps the members of a /v1/completions body besides
// its prompt onto CompletionRequest, field for field as xllm-service
// fills them.
func completionMessage(rest []byte) (*xllmpb.CompletionRequest, *parsedRequest, error) {
	var j completionFields
	if err := decodeBody(rest, &j); err != nil {
		return nil, nil, err
	}
	stop, err := stopList(j.Stop)
	if err != nil {
		return nil, nil, err
	}
	req := &xllmpb.CompletionRequest{
		Model: j.Model, BestOf: j.BestOf, MaxTokens: j.MaxTokens, Temperature: j.Temperature, TopP: j.TopP, N: j.N,
		Stream: j.Stream, Logprobs: j.Logprobs, Echo: j.Echo, Stop: stop, PresencePenalty: j.PresencePenalty,
		FrequencyPenalty: j.FrequencyPenalty, SkipSpecialTokens: j.SkipSpecialTokens, IgnoreEos: j.IgnoreEOS, User: j.User,
		StopTokenIds: j.StopTokenIDs, TopK: j.TopK, RepetitionPenalty: j.RepetitionPenalty, RequestId: j.RequestID,
	}
	if j.StreamOptions != nil {
		req.StreamOptions = &xllmpb.StreamOptions{IncludeUsage: j.StreamOptions.IncludeUsage}
	}
	return req, &parsedRequest{model: j.Model, stream: j.Stream != nil && *j.Stream,
		includeUsage: req.GetStreamOptions().GetIncludeUsage()}, nil
}

// chatMessage maps the members of a /v1/chat/completions body besides
// its messages onto ChatRequest.
func chatMessage(rest []byte) (*xllmpb.ChatRequest, *parsedRequest, error) {
	var j chatFields
	if err := decodeBody(rest, &j); err != nil {
		return nil, nil, err
	}
	stop, err := stopList(j.Stop)
	if err != nil {
		return nil, nil, err
	}
	req := &xllmpb.ChatRequest{
		Model: j.Model, BestOf: j.BestOf, Temperature: j.Temperature, TopP: j.TopP, N: j.N, Stream: j.Stream, Stop: stop,
		MaxTokens: j.MaxTokens, PresencePenalty: j.PresencePenalty, FrequencyPenalty: j.FrequencyPenalty, User: j.User,
		StopTokenIds: j.StopTokenIDs, RepetitionPenalty: j.RepetitionPenalty, TopK: j.TopK, SkipSpecialTokens: j.SkipSpecialTokens,
		IgnoreEos: j.IgnoreEOS, Logprobs: j.Logprobs, TopLogprobs: j.TopLogprobs, RequestId: j.RequestID,
	}
	if j.MaxCompletionTokens != nil {
		req.MaxTokens = j.MaxCompletionTokens
	}
	if j.StreamOptions != nil {
		req.StreamOptions = &xllmpb.StreamOptions{IncludeUsage: j.StreamOptions.IncludeUsage}
	}
	if j.ResponseFormat != nil {
		req.ResponseFormat = &xllmpb.ResponseFormat{Type: j.ResponseFormat.Type}
	}
	for i, t := range j.Tools {
		params, err := structpb.NewStruct(t.Function.Parameters)
		if err != nil {
			return nil, nil, badRequest("tools[%d].function.parameters: %v", i, err)
		}
		req.Tools = append(req.Tools, &xllmpb.Tool{Type: t.Type,
			Function: &xllmpb.Function{Name: t.Function.Name, Description: t.Function.Description, Parameters: params}})
	}
	if tc := bytes.TrimSpace(j.ToolChoice); len(tc) > 0 && string(tc) != "null" {
		var s string
		if json.Unmarshal(tc, &s) != nil {
			s = string(tc) // an object choice goes as its JSON
		}
		req.ToolChoice = &s
	}
	if j.ChatTemplateKwargs != nil {
		kw, err := structpb.NewStruct(j.ChatTemplateKwargs)
		if err != nil {
			return nil, nil, badRequest("chat_template_kwargs: %v", err)
		}
		req.ChatTemplateKwargs = kw
	}
	return req, &parsedRequest{chat: true, model: j.Model, stream: j.Stream != nil && *j.Stream,
		includeUsage: req.GetStreamOptions().GetIncludeUsage()}, nil
}

// extrasOf reads the members of message i besides role and content into
// an xLLM ChatMessage holding only those; nil when it has none.
func extrasOf(raw []byte, i int) (*xllmpb.ChatMessage, error) {
	var j messageExtras
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, badRequest("messages[%d]: %v", i, err)
	}
	if j.ReasoningContent == nil && j.ToolCallID == nil && len(j.ToolCalls) == 0 {
		return nil, nil
	}
	m := &xllmpb.ChatMessage{ReasoningContent: j.ReasoningContent, ToolCallId: j.ToolCallID}
	for _, tc := range j.ToolCalls {
		m.ToolCalls = append(m.ToolCalls, &xllmpb.ToolCall{Id: tc.ID, Type: tc.Type,
			Function: &xllmpb.FunctionCall{Name: tc.Function.Name, Arguments: tc.Function.Arguments}})
	}
	return m, nil
}

// readPrompt finds the prompt (completions) or the messages (chat) of
// body with encoding/json, for a caller that has not read them itself;
// it returns the prompt's token ids when they are given as ids.
func readPrompt(chat bool, body []byte) (*Prompt, []uint32, error) {
	want := "prompt"
	if chat {
		want = "messages"
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, nil, badRequest("request body must be a JSON object")
	}
	p := &Prompt{Start: -1}
	var raw json.RawMessage
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return nil, nil, badRequest("invalid JSON body: %v", err)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, nil, badRequest("invalid JSON body: %v", err)
		}
		if key, _ := kt.(string); key == want {
			end := int(dec.InputOffset())
			p.Start, p.End, raw = end-len(v), end, v
		}
	}
	if p.Start < 0 {
		if chat {
			return nil, nil, badRequest("messages is required and must not be empty")
		}
		return nil, nil, badRequest("prompt is required")
	}
	if chat {
		var err error
		p.Messages, err = messagesOf(raw)
		return p, nil, err
	}
	var ids []uint32
	var err error
	p.Text, ids, p.Count, err = promptOf(raw)
	return p, ids, err
}

// promptOf reads a completion prompt: a string, an array of strings, an
// array of token ids, or an array of those; count is the number of
// prompts, of which the first is returned.
func promptOf(raw json.RawMessage) (text []byte, ids []uint32, count int, err error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil, 0, badRequest("prompt is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []byte(s), nil, 1, nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil {
		if len(ss) == 0 {
			return nil, nil, 0, badRequest("prompt is empty")
		}
		return []byte(ss[0]), nil, len(ss), nil
	}
	if json.Unmarshal(raw, &ids) == nil {
		return nil, ids, 1, nil
	}
	var batch [][]uint32
	if json.Unmarshal(raw, &batch) == nil && len(batch) > 0 {
		return nil, batch[0], len(batch), nil
	}
	return nil, nil, 0, badRequest("prompt must be a string, an array of token ids, or an array of those")
}

// messagesOf reads a chat's messages array.
func messagesOf(raw json.RawMessage) ([]Message, error) {
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, badRequest("messages must be an array of objects")
	}
	out := make([]Message, len(elems))
	for i, e := range elems {
		var members map[string]json.RawMessage
		if err := json.Unmarshal(e, &members); err != nil {
			return nil, badRequest("messages[%d] must be an object", i)
		}
		var role *string
		if r, ok := members["role"]; ok {
			if err := json.Unmarshal(r, &role); err != nil {
				return nil, badRequest("messages[%d].role must be a string", i)
			}
		}
		if role != nil {
			out[i].Role = []byte(*role)
		}
		text, err := contentText(members["content"])
		if err != nil {
			return nil, badRequest("messages[%d].content: %v", i, err)
		}
		out[i].Content = []byte(text)
		delete(members, "role")
		delete(members, "content")
		if len(members) > 0 {
			out[i].Raw = e
		}
	}
	return out, nil
}

// contentText joins a message's text: a string, or the text parts of an
// array of content parts, one line each, as xllm-service joins them.
func contentText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf("must be a string or an array of content parts")
	}
	var texts []string
	for _, p := range parts {
		if p.Type == "text" {
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, "\n"), nil
}

// The OpenAI response shapes, as xllm-service writes them from the
// engine's output.
type responseJSON struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []choiceJSON `json:"choices"`
	Usage   *usageJSON   `json:"usage,omitempty"`
}

type choiceJSON struct {
	Index        int32        `json:"index"`
	Text         *string      `json:"text,omitempty"`
	Message      *messageJSON `json:"message,omitempty"`
	Delta        *messageJSON `json:"delta,omitempty"`
	FinishReason *string      `json:"finish_reason"`
}

type messageJSON struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type usageJSON struct {
	PromptTokens        int32                `json:"prompt_tokens"`
	CompletionTokens    int32                `json:"completion_tokens"`
	TotalTokens         int32                `json:"total_tokens"`
	PromptTokensDetails *promptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

// promptTokensDetails is OpenAI's, and xLLM's Usage's, account of the
// prompt tokens the engine found in its KV cache.
type promptTokensDetails struct {
	CachedTokens int32 `json:"cached_tokens"`
}

func usageOf(u *xllmpb.OutputUsage) *usageJSON {
	if u == nil {
		return nil
	}
	out := &usageJSON{PromptTokens: u.NumPromptTokens, CompletionTokens: u.NumGeneratedTokens, TotalTokens: u.NumTotalTokens}
	if u.NumCachedTokens > 0 {
		out.PromptTokensDetails = &promptTokensDetails{CachedTokens: u.NumCachedTokens}
	}
	return out
}

// appendResponse appends r as JSON, as encoding/json would write it
// (field order, omitempty, null finish reasons), without reflection: it
// is written for every streamed token.
func appendResponse(b []byte, r *responseJSON) []byte {
	b = append(b, `{"id":`...)
	b = jsonw.String(b, r.ID)
	b = append(b, `,"object":`...)
	b = jsonw.String(b, r.Object)
	b = append(b, `,"created":`...)
	b = strconv.AppendInt(b, r.Created, 10)
	b = append(b, `,"model":`...)
	b = jsonw.String(b, r.Model)
	b = append(b, `,"choices":[`...)
	for i := range r.Choices {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendChoice(b, &r.Choices[i])
	}
	b = append(b, ']')
	if u := r.Usage; u != nil {
		b = append(b, `,"usage":{"prompt_tokens":`...)
		b = strconv.AppendInt(b, int64(u.PromptTokens), 10)
		b = append(b, `,"completion_tokens":`...)
		b = strconv.AppendInt(b, int64(u.CompletionTokens), 10)
		b = append(b, `,"total_tokens":`...)
		b = strconv.AppendInt(b, int64(u.TotalTokens), 10)
		if d := u.PromptTokensDetails; d != nil {
			b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
			b = strconv.AppendInt(b, int64(d.CachedTokens), 10)
			b = append(b, '}')
		}
		b = append(b, '}')
	}
	return append(b, '}')
}

func appendChoice(b []byte, c *choiceJSON) []byte {
	b = append(b, `{"index":`...)
	b = strconv.AppendInt(b, int64(c.Index), 10)
	if c.Text != nil {
		b = append(b, `,"text":`...)
		b = jsonw.String(b, *c.Text)
	}
	if c.Message != nil {
		b = append(b, `,"message":`...)
		b = appendMessage(b, c.Message)
	}
	if c.Delta != nil {
		b = append(b, `,"delta":`...)
		b = appendMessage(b, c.Delta)
	}
	b = append(b, `,"finish_reason":`...)
	if c.FinishReason == nil {
		b = append(b, "null"...)
	} else {
		b = jsonw.String(b, *c.FinishReason)
	}
	return append(b, '}')
}

func appendMessage(b []byte, m *messageJSON) []byte {
	b = append(b, '{')
	if m.Role != "" {
		b = append(b, `"role":`...)
		b = jsonw.String(b, m.Role)
	}
	if m.Content != nil {
		if m.Role != "" {
			b = append(b, ',')
		}
		b = append(b, `"content":`...)
		b = jsonw.String(b, *m.Content)
	}
	return append(b, '}')
}
