package enginesim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvcar/kvcar/internal/tokenizer"
)

// Extensions of the OpenAI request and response JSON that the emulated
// engine understands, for kvcar and for benchmarks.
const (
	// TokenIDsField is the optional top-level request field carrying the
	// exact prompt token ids, for chat requests above all: when present
	// it replaces the prompt or the messages, which then only have to be
	// valid JSON.
	TokenIDsField = "kvcar_token_ids"
	// EngineUsageField is the top-level response field holding an
	// EngineUsage: in a whole response, or in the last chunk of a stream,
	// the one with the finish reason.
	EngineUsageField = "kvcar_engine"
	// PrefillNameHeader and DecodeNameHeader carry the routing names when
	// the body's routing object does not; the body wins name by name.
	PrefillNameHeader = "X-Prefill-Name"
	DecodeNameHeader  = "X-Decode-Name"
)

// Request limits. maxRequestBody leaves room for prompts of a few million
// token ids; maxCompletionTokens keeps a mistaken max_tokens from holding
// a slot for hours.
const (
	defaultMaxTokens    = 16
	maxCompletionTokens = 1 << 16
	maxRequestBody      = 64 << 20
)

// EngineUsage is what the engine reports about how it served one request.
// Times are wall-clock milliseconds, after TimeScale: divide by
// TimeScale for the emulated ones. The emulated TTFT is QueueMs +
// PrefillMs; DeviceHitTokens + HostHitTokens prompt tokens were not
// recomputed.
type EngineUsage struct {
	Instance        string  `json:"instance"`
	DPRank          int     `json:"dp_rank"`
	DeviceHitTokens int     `json:"device_hit_tokens"`
	HostHitTokens   int     `json:"host_hit_tokens"`
	QueueMs         float64 `json:"queue_ms"`
	PrefillMs       float64 `json:"prefill_ms"`
	DecodeMs        float64 `json:"decode_ms"`
	TimeScale       float64 `json:"time_scale"`
	// PrefillName and DecodeName are the routing names that arrived,
	// empty when none did.
	PrefillName string `json:"prefill_name"`
	DecodeName  string `json:"decode_name"`
}

// SetFailRequests makes /v1/completions and /v1/chat/completions answer
// every request at once with status and an OpenAI error body; 0 turns it
// off, and a status outside 400-599 counts as 500. Like the other fault
// settings it survives Restart.
func (e *Engine) SetFailRequests(status int) {
	if status != 0 && (status < 400 || status > 599) {
		status = http.StatusInternalServerError
	}
	e.failStatus.Store(int32(status))
}

// inference is one parsed completion request.
type inference struct {
	chat         bool
	model        string
	tokens       []uint32
	maxTokens    int
	stream       bool
	includeUsage bool
	prefillName  string
	decodeName   string
}

// completionRequest is the part of both OpenAI request bodies the engine
// reads; every other field (temperature and the like) is ignored, as it
// does not change the emulated cost.
type completionRequest struct {
	Model               string            `json:"model"`
	Prompt              json.RawMessage   `json:"prompt"`
	Messages            []chatMessageJSON `json:"messages"`
	TokenIDs            []uint32          `json:"kvcar_token_ids"`
	MaxTokens           *int              `json:"max_tokens"`
	MaxCompletionTokens *int              `json:"max_completion_tokens"`
	N                   *int              `json:"n"`
	Stream              bool              `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Routing *struct {
		PrefillName string `json:"prefill_name"`
		DecodeName  string `json:"decode_name"`
	} `json:"routing"`
}

type chatMessageJSON struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// badRequest is a client error with its status.
type badRequest struct {
	code int
	msg  string
}

func (b *badRequest) Error() string { return b.msg }

func invalid(format string, args ...any) error {
	return &badRequest{code: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

// parseInference reads and checks the body of a completion request.
func parseInference(w http.ResponseWriter, r *http.Request, chat bool, tok *tokenizer.Tokenizer) (*inference, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBody))
	if err != nil {
		if mb := (*http.MaxBytesError)(nil); errors.As(err, &mb) {
			return nil, &badRequest{code: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("request body exceeds %d bytes", mb.Limit)}
		}
		return nil, invalid("reading request body: %v", err)
	}
	var req completionRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, invalid("invalid JSON body: %v", err)
	}
	inf := &inference{chat: chat, model: req.Model, stream: req.Stream}
	if req.StreamOptions != nil {
		inf.includeUsage = req.StreamOptions.IncludeUsage
	}
	if req.N != nil && *req.N != 1 {
		return nil, invalid("n = %d: the emulated engine returns exactly one choice", *req.N)
	}
	inf.maxTokens = defaultMaxTokens
	if mt := req.MaxTokens; mt != nil {
		inf.maxTokens = *mt
	}
	if mt := req.MaxCompletionTokens; chat && mt != nil {
		inf.maxTokens = *mt
	}
	if inf.maxTokens < 0 || inf.maxTokens > maxCompletionTokens {
		return nil, invalid("max_tokens %d is outside [0, %d]", inf.maxTokens, maxCompletionTokens)
	}
	switch {
	case req.TokenIDs != nil:
		inf.tokens = req.TokenIDs
	case chat:
		if inf.tokens, err = chatTokens(req.Messages, tok); err != nil {
			return nil, err
		}
	default:
		if inf.tokens, err = promptTokens(req.Prompt, tok); err != nil {
			return nil, err
		}
	}
	if len(inf.tokens) == 0 {
		return nil, invalid("the prompt has no tokens")
	}
	if rt := req.Routing; rt != nil {
		inf.prefillName, inf.decodeName = rt.PrefillName, rt.DecodeName
	}
	if inf.prefillName == "" {
		inf.prefillName = r.Header.Get(PrefillNameHeader)
	}
	if inf.decodeName == "" {
		inf.decodeName = r.Header.Get(DecodeNameHeader)
	}
	return inf, nil
}

// promptTokens reads a completion prompt: token ids as they are, or a
// string for the model tokenizer (the toy one when tok is nil), alone or
// as the only element of a batch. Batches of several prompts are refused:
// one request is one sequence.
func promptTokens(raw json.RawMessage, tok *tokenizer.Tokenizer) ([]uint32, error) {
	raw = json.RawMessage(strings.TrimSpace(string(raw)))
	if len(raw) == 0 || string(raw) == "null" {
		return nil, invalid("prompt is required")
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, invalid("prompt: %v", err)
		}
		return encodeText(s, tok)
	case '[':
		inner := strings.TrimLeft(string(raw[1:]), " \t\r\n")
		if inner == "" || inner[0] == ']' {
			return nil, invalid("prompt is empty")
		}
		switch inner[0] {
		case '"':
			var ss []string
			if err := json.Unmarshal(raw, &ss); err != nil {
				return nil, invalid("prompt: %v", err)
			}
			if len(ss) != 1 {
				return nil, invalid("prompt holds %d prompts: batches are not supported", len(ss))
			}
			return encodeText(ss[0], tok)
		case '[':
			var ids [][]uint32
			if err := json.Unmarshal(raw, &ids); err != nil {
				return nil, invalid("prompt: token ids must be integers in [0, 2^32): %v", err)
			}
			if len(ids) != 1 {
				return nil, invalid("prompt holds %d prompts: batches are not supported", len(ids))
			}
			return ids[0], nil
		default:
			var ids []uint32
			if err := json.Unmarshal(raw, &ids); err != nil {
				return nil, invalid("prompt: token ids must be integers in [0, 2^32): %v", err)
			}
			return ids, nil
		}
	}
	return nil, invalid("prompt must be a string or an array of token ids")
}

// encodeText tokenizes a text prompt like the engine's model would, or
// with the toy tokenizer when no model tokenizer is configured.
func encodeText(s string, tok *tokenizer.Tokenizer) ([]uint32, error) {
	if tok == nil {
		return ToyTokenize(s), nil
	}
	ids, err := tok.Encode(s, nil)
	if err != nil {
		return nil, invalid("prompt: %v", err)
	}
	return ids, nil
}

// chatTokens applies the model's chat template (the toy one when tok is
// nil) and tokenizes the result.
func chatTokens(msgs []chatMessageJSON, tok *tokenizer.Tokenizer) ([]uint32, error) {
	if len(msgs) == 0 {
		return nil, invalid("messages is required and must not be empty")
	}
	flat := make([]ChatMessage, len(msgs))
	for i, m := range msgs {
		if m.Role == "" {
			return nil, invalid("messages[%d].role is required", i)
		}
		text, err := contentText(m.Content)
		if err != nil {
			return nil, invalid("messages[%d].content: %v", i, err)
		}
		flat[i] = ChatMessage{Role: m.Role, Content: text}
	}
	return chatTokenIDs(flat, tok)
}

// chatTokenIDs applies the chat template and tokenizes the result.
func chatTokenIDs(flat []ChatMessage, tok *tokenizer.Tokenizer) ([]uint32, error) {
	if tok == nil {
		return ChatTokenIDs(flat), nil
	}
	tm := make([]tokenizer.Message, len(flat))
	for i, m := range flat {
		tm[i] = tokenizer.Message{Role: m.Role, Content: m.Content}
	}
	ids, err := tok.EncodeChat(tm, nil)
	if err != nil {
		return nil, invalid("messages: %v", err)
	}
	return ids, nil
}

// contentText joins a message's text: a string, or the text parts of an
// array of content parts (other parts, such as images, cost nothing
// here).
func contentText(raw json.RawMessage) (string, error) {
	s := strings.TrimSpace(string(raw))
	if s == "" || s == "null" {
		return "", nil
	}
	if s[0] == '"' {
		var text string
		if err := json.Unmarshal(raw, &text); err != nil {
			return "", err
		}
		return text, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("must be a string or an array of content parts")
	}
	var texts []string
	for _, p := range parts {
		if p.Type == "text" {
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, " "), nil
}

// The OpenAI response shapes, for both endpoints, whole and streamed.
type completionResponse struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []choice     `json:"choices"`
	Usage   *usage       `json:"usage,omitempty"`
	Engine  *EngineUsage `json:"kvcar_engine,omitempty"`
}

type choice struct {
	Index        int         `json:"index"`
	Text         *string     `json:"text,omitempty"`
	Message      *chatOutput `json:"message,omitempty"`
	Delta        *chatOutput `json:"delta,omitempty"`
	FinishReason *string     `json:"finish_reason"`
}

type chatOutput struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// finishLength is the only finish reason: the filler output never ends
// on its own, so every request runs to max_tokens.
const finishLength = "length"

// fillerToken is output token i (from 1) as streamed: the deterministic
// filler "tok1 tok2 ...", each token after the first with its space.
func fillerToken(i int) string {
	if i == 1 {
		return "tok1"
	}
	return " tok" + strconv.Itoa(i)
}

func fillerText(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		b.WriteString(fillerToken(i))
	}
	return b.String()
}

func writeError(w http.ResponseWriter, code int, msg string) {
	typ := "invalid_request_error"
	if code >= 500 {
		typ = "server_error"
	}
	body, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": code}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

func (e *Engine) handleCompletions(w http.ResponseWriter, r *http.Request) {
	e.serveInference(w, r, false)
}

func (e *Engine) handleChatCompletions(w http.ResponseWriter, r *http.Request) {
	e.serveInference(w, r, true)
}

// handleModels lists the one model the engine serves.
func (e *Engine) handleModels(w http.ResponseWriter, _ *http.Request) {
	body, _ := json.Marshal(map[string]any{
		"object": "list",
		"data": []map[string]any{{
			"id":       e.cfg.ModelName,
			"object":   "model",
			"created":  e.cfg.Clock().Unix(),
			"owned_by": "enginesim",
		}},
	})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

func (e *Engine) scaled(d time.Duration) time.Duration {
	return time.Duration(float64(d) * e.cfg.TimeScale)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// pause waits d, or less when the client goes away or the process ends.
func pause(ctx context.Context, g *generation, d time.Duration) error {
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		case <-g.ctx.Done():
		}
	}
	if g.ctx.Err() != nil {
		return errAborted
	}
	return ctx.Err()
}

// serveInference runs one request through the cost model: a slot of the
// least loaded rank, prefill on that rank's cache (the hits are the
// engine's truth and the cache's events go out as for Prefill), then
// decode. The prefill step yields the first output token, so a stream's
// first chunk arrives after queue and prefill time, and each further
// token takes one decode step.
func (e *Engine) serveInference(w http.ResponseWriter, r *http.Request, chat bool) {
	if code := int(e.failStatus.Load()); code != 0 {
		e.serve.count(func(st *EngineStats) { st.Failed++ })
		writeError(w, code, "injected engine failure")
		return
	}
	inf, err := parseInference(w, r, chat, e.cfg.Tokenizer)
	if err != nil {
		e.serve.count(func(st *EngineStats) { st.BadRequests++ })
		code := http.StatusBadRequest
		if br := (*badRequest)(nil); errors.As(err, &br) {
			code = br.code
		}
		writeError(w, code, err.Error())
		return
	}
	// A request takes as long as the cost model says, possibly longer
	// than the server's timeouts, and the pending read past the body is
	// what tells a closed connection: neither may expire under it.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})

	name := e.Name()
	if inf.prefillName != "" && inf.prefillName != name {
		e.serve.count(func(st *EngineStats) { st.Misrouted++ })
	}
	t, err := e.serve.admit()
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	defer t.done()
	ctx := r.Context()
	queued, err := t.wait(ctx)
	if err != nil {
		e.endEarly(err)
		return
	}

	dev, host, prefill, err := e.prefillOn(t, inf.tokens, queued)
	if err != nil {
		if errors.Is(err, errAborted) {
			e.endEarly(errAborted)
			return
		}
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	step := e.scaled(e.cfg.DecodePerToken)
	decode := time.Duration(max(inf.maxTokens-1, 0)) * step
	eu := &EngineUsage{
		Instance: name, DPRank: t.dp, DeviceHitTokens: dev, HostHitTokens: host,
		QueueMs: ms(queued), PrefillMs: ms(prefill), DecodeMs: ms(decode), TimeScale: e.cfg.TimeScale,
		PrefillName: inf.prefillName, DecodeName: inf.decodeName,
	}
	if err := pause(ctx, t.g, prefill); err != nil {
		e.endEarly(err)
		return
	}
	resp := e.newResponse(inf)
	if inf.stream {
		err = e.stream(ctx, w, rc, t.g, inf, resp, step, eu)
	} else {
		if err = pause(ctx, t.g, decode); err == nil {
			e.writeWhole(w, inf, resp, eu)
		}
	}
	if err != nil {
		e.endEarly(err)
		return
	}
	e.serve.count(func(st *EngineStats) {
		st.Completed++
		st.CompletionTokens += uint64(inf.maxTokens)
		st.DecodeTime += decode
	})
}

// prefillOn runs a request's prompt through the cache of the ticket's
// rank, so that its hits are the engine's truth and the cache's events go
// out as for Prefill, and accounts for it. It returns the hits and the
// prefill time the cost model gives (scaled); errAborted when the process
// ended, ErrNotRunning when the engine is stopped.
func (e *Engine) prefillOn(t *ticket, tokens []uint32, queued time.Duration) (dev, host int, prefill time.Duration, err error) {
	dev, host, err = e.Prefill(t.dp, tokens)
	if err != nil {
		if t.g.ctx.Err() != nil {
			return 0, 0, 0, errAborted
		}
		if errors.Is(err, ErrNotRunning) {
			return 0, 0, 0, err
		}
		// The cache has served the prompt and only its announcement
		// failed; a real engine does not fail the request for that.
		e.cfg.Logger.Warn("publishing prefill events failed", "engine", e.Name(), "dp", t.dp, "err", err)
	}
	prefill = e.scaled(e.CostModel().Prefill(len(tokens), dev, host))
	e.serve.count(func(st *EngineStats) {
		st.Requests++
		st.PromptTokens += uint64(len(tokens))
		st.DeviceHitTokens += uint64(dev)
		st.HostHitTokens += uint64(host)
		st.QueueTime += queued
		st.PrefillTime += prefill
	})
	return dev, host, prefill, nil
}

// endEarly accounts for a request that cannot finish. The end of the
// process drops the connection, as a dying engine's connections drop; a
// client that went away just frees its place.
func (e *Engine) endEarly(err error) {
	if errors.Is(err, errAborted) {
		e.serve.count(func(st *EngineStats) { st.Aborted++ })
		panic(http.ErrAbortHandler)
	}
	e.serve.count(func(st *EngineStats) { st.Cancelled++ })
}

func (e *Engine) newResponse(inf *inference) completionResponse {
	resp := completionResponse{
		ID:      "cmpl-" + strconv.FormatUint(e.serve.nextID(), 10),
		Object:  "text_completion",
		Created: e.cfg.Clock().Unix(),
		Model:   inf.model,
	}
	if resp.Model == "" {
		resp.Model = e.cfg.ModelName
	}
	if inf.chat {
		resp.ID = "chat" + resp.ID
		resp.Object = "chat.completion"
	}
	return resp
}

func usageOf(inf *inference) *usage {
	return &usage{PromptTokens: len(inf.tokens), CompletionTokens: inf.maxTokens, TotalTokens: len(inf.tokens) + inf.maxTokens}
}

func (e *Engine) writeWhole(w http.ResponseWriter, inf *inference, resp completionResponse, eu *EngineUsage) {
	text, finish := fillerText(inf.maxTokens), finishLength
	c := choice{FinishReason: &finish}
	if inf.chat {
		c.Message = &chatOutput{Role: "assistant", Content: &text}
	} else {
		c.Text = &text
	}
	resp.Choices, resp.Usage, resp.Engine = []choice{c}, usageOf(inf), eu
	body, err := json.Marshal(resp)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

// stream sends one SSE chunk per output token, the first at once and each
// further one a decode step later, then the finish chunk with the
// EngineUsage, a usage chunk when stream_options.include_usage asks for
// it, and [DONE]. A failed write means the client has gone.
func (e *Engine) stream(ctx context.Context, w http.ResponseWriter, rc *http.ResponseController,
	g *generation, inf *inference, resp completionResponse, step time.Duration, eu *EngineUsage,
) error {
	if inf.chat {
		resp.Object = "chat.completion.chunk"
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	send := func(r completionResponse) error {
		body, err := json.Marshal(r)
		if err != nil {
			return fmt.Errorf("encoding chunk: %w", err)
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", body); err != nil {
			return fmt.Errorf("writing chunk: %w", context.Canceled)
		}
		if err := rc.Flush(); err != nil {
			return fmt.Errorf("flushing chunk: %w", context.Canceled)
		}
		return nil
	}
	for i := 1; i <= inf.maxTokens; i++ {
		if i > 1 {
			if err := pause(ctx, g, step); err != nil {
				return err
			}
		}
		text := fillerToken(i)
		c := choice{}
		if inf.chat {
			c.Delta = &chatOutput{Content: &text}
			if i == 1 {
				c.Delta.Role = "assistant"
			}
		} else {
			c.Text = &text
		}
		resp.Choices = []choice{c}
		if err := send(resp); err != nil {
			return err
		}
	}
	finish, empty := finishLength, ""
	last := choice{FinishReason: &finish}
	if inf.chat {
		last.Delta = &chatOutput{}
	} else {
		last.Text = &empty
	}
	resp.Choices, resp.Engine = []choice{last}, eu
	if err := send(resp); err != nil {
		return err
	}
	if inf.includeUsage {
		resp.Choices, resp.Engine, resp.Usage = []choice{}, nil, usageOf(inf)
		if err := send(resp); err != nil {
			return err
		}
	}
	if _, err := io.WriteString(w, "data: [DONE]\n\n"); err != nil {
		return fmt.Errorf("writing [DONE]: %w", context.Canceled)
	}
	if err := rc.Flush(); err != nil {
		return fmt.Errorf("flushing [DONE]: %w", context.Canceled)
	}
	return nil
}
