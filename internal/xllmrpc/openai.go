package xllmrpc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"

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

type completionJSON struct {
	samplingJSON
	Prompt   json.RawMessage `json:"prompt"`
	Logprobs *uint32         `json:"logprobs"`
	Echo     *bool           `json:"echo"`
}

type chatJSON struct {
	samplingJSON
	Messages            []chatMessageJSON `json:"messages"`
	MaxCompletionTokens *uint32           `json:"max_completion_tokens"`
	Logprobs            *bool             `json:"logprobs"`
	TopLogprobs         *int32            `json:"top_logprobs"`
	Tools               []toolJSON        `json:"tools"`
	ToolChoice          json.RawMessage   `json:"tool_choice"`
	ChatTemplateKwargs  map[string]any    `json:"chat_template_kwargs"`
	ResponseFormat      *struct {
		Type *string `json:"type"`
	} `json:"response_format"`
}

type chatMessageJSON struct {
	Role             *string         `json:"role"`
	Content          json.RawMessage `json:"content"`
	ReasoningContent *string         `json:"reasoning_content"`
	ToolCallID       *string         `json:"tool_call_id"`
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

// badRequestError is a request kvcar cannot send: HTTP 400.
type badRequestError struct{ msg string }

func (e *badRequestError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &badRequestError{msg: fmt.Sprintf(format, args...)}
}

// parsedRequest is an OpenAI request turned into its xLLM message.
type parsedRequest struct {
	completion   *xllmpb.CompletionRequest
	chat         *xllmpb.ChatRequest
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

// parseCompletion maps a /v1/completions body onto CompletionRequest. A
// prompt of token ids is sent as token_ids; batches of prompts are
// refused, as one service request is one sequence.
func parseCompletion(body []byte) (*parsedRequest, []int32, error) {
	var j completionJSON
	if err := decodeBody(body, &j); err != nil {
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
	var promptIDs []int32
	req.Prompt, promptIDs, err = promptOf(j.Prompt)
	if err != nil {
		return nil, nil, err
	}
	return &parsedRequest{completion: req, model: j.Model, stream: j.Stream != nil && *j.Stream,
		includeUsage: req.GetStreamOptions().GetIncludeUsage()}, promptIDs, nil
}

// promptOf reads a completion prompt: a string, a one-element array of
// strings, or token ids (flat or a one-element batch).
func promptOf(raw json.RawMessage) (string, []int32, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil, badRequest("prompt is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil, nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil {
		if len(ss) != 1 {
			return "", nil, badRequest("prompt holds %d prompts: send one per request", len(ss))
		}
		return ss[0], nil, nil
	}
	var ids []int32
	if json.Unmarshal(raw, &ids) == nil {
		if len(ids) == 0 {
			return "", nil, badRequest("prompt is empty")
		}
		return "", ids, nil
	}
	var batch [][]int32
	if json.Unmarshal(raw, &batch) == nil {
		if len(batch) != 1 || len(batch[0]) == 0 {
			return "", nil, badRequest("prompt holds %d token id prompts: send one per request", len(batch))
		}
		return "", batch[0], nil
	}
	return "", nil, badRequest("prompt must be a string or an array of token ids in [0, 2^31)")
}

// parseChat maps a /v1/chat/completions body onto ChatRequest.
func parseChat(body []byte) (*parsedRequest, error) {
	var j chatJSON
	if err := decodeBody(body, &j); err != nil {
		return nil, err
	}
	if len(j.Messages) == 0 {
		return nil, badRequest("messages is required and must not be empty")
	}
	stop, err := stopList(j.Stop)
	if err != nil {
		return nil, err
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
	for i, m := range j.Messages {
		if m.Role == nil || *m.Role == "" {
			return nil, badRequest("messages[%d].role is required", i)
		}
		text, err := contentText(m.Content)
		if err != nil {
			return nil, badRequest("messages[%d].content: %v", i, err)
		}
		pm := &xllmpb.ChatMessage{Role: m.Role, Content: &text, ReasoningContent: m.ReasoningContent, ToolCallId: m.ToolCallID}
		for _, tc := range m.ToolCalls {
			pm.ToolCalls = append(pm.ToolCalls, &xllmpb.ToolCall{Id: tc.ID, Type: tc.Type,
				Function: &xllmpb.FunctionCall{Name: tc.Function.Name, Arguments: tc.Function.Arguments}})
		}
		req.Messages = append(req.Messages, pm)
	}
	for i, t := range j.Tools {
		params, err := structpb.NewStruct(t.Function.Parameters)
		if err != nil {
			return nil, badRequest("tools[%d].function.parameters: %v", i, err)
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
			return nil, badRequest("chat_template_kwargs: %v", err)
		}
		req.ChatTemplateKwargs = kw
	}
	return &parsedRequest{chat: req, model: j.Model, stream: j.Stream != nil && *j.Stream,
		includeUsage: req.GetStreamOptions().GetIncludeUsage()}, nil
}

// contentText joins a message's text: a string, or the text parts of an
// array of content parts.
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
	PromptTokens     int32 `json:"prompt_tokens"`
	CompletionTokens int32 `json:"completion_tokens"`
	TotalTokens      int32 `json:"total_tokens"`
}

func usageOf(u *xllmpb.OutputUsage) *usageJSON {
	if u == nil {
		return nil
	}
	return &usageJSON{PromptTokens: u.NumPromptTokens, CompletionTokens: u.NumGeneratedTokens, TotalTokens: u.NumTotalTokens}
}
