package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/kvcar/kvcar/internal/lb"
)

// Routes of the OpenAI-compatible request path.
const (
	CompletionsPath     = "/v1/completions"
	ChatCompletionsPath = "/v1/chat/completions"
	ModelsPath          = "/v1/models"
)

// Headers that carry the routing decision to the engine (WIRE.md
// routing{prefill_name, decode_name}) and report it to the client. The
// OpenAI body is relayed unchanged.
const (
	PrefillNameHeader    = "X-Prefill-Name"
	DecodeNameHeader     = "X-Decode-Name"
	PolicyHeader         = "X-Kvcar-Policy"
	DecisionMicrosHeader = "X-Kvcar-Decision-Us"
	HitRatioHeader       = "X-Kvcar-Hit-Ratio"
)

// maxInferenceBody bounds a completion request body.
const maxInferenceBody = 64 << 20

// Router makes a routing decision from in-process state only: the
// registry snapshot and the KV directory (R-DIR-4). It must not block.
type Router interface {
	Policy() string
	Route(req lb.Request) (lb.Decision, error)
}

// Tokenizer turns text and chat messages into the token ids the engine
// will see, so that CAR can look up their prefix.
type Tokenizer interface {
	Encode(text string, dst []uint32) ([]uint32, error)
	EncodeChat(messages []ChatMessage, dst []uint32) ([]uint32, error)
}

// ChatMessage is one chat turn with its text content.
type ChatMessage struct {
	Role, Content string
}

// completionRequest holds the fields routing needs; everything else is
// relayed untouched.
type completionRequest struct {
	Prompt   json.RawMessage `json:"prompt"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Stream bool `json:"stream"`
}

// proxy is the request path: decide, forward, relay.
type proxy struct {
	router          Router
	tokenizer       Tokenizer
	client          *http.Client
	log             *slog.Logger
	warnNoTokenizer sync.Once
	observe         func(d lb.Decision, took time.Duration)
}

func newTransport() *http.Transport {
	return &http.Transport{
		Proxy:                 nil,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 10 * time.Minute,
		ExpectContinueTimeout: time.Second,
	}
}

// handleInference serves /v1/completions and /v1/chat/completions.
func (s *Server) handleInference(w http.ResponseWriter, r *http.Request) {
	p := s.proxy
	if p == nil {
		writeError(w, http.StatusServiceUnavailable, "no router: kvcar runs without an instance registry")
		return
	}
	if !s.ready.Load() {
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "service is not ready")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxInferenceBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeError(w, http.StatusRequestEntityTooLarge, "request body exceeds "+strconv.Itoa(maxInferenceBody)+" bytes")
			return
		}
		writeError(w, http.StatusBadRequest, "reading body: "+err.Error())
		return
	}
	var req completionRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, "request body is not a JSON object: "+err.Error())
		return
	}
	chat := r.URL.Path == ChatCompletionsPath
	ids, estimate, err := p.tokens(&req, chat)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}

	start := time.Now()
	d, err := p.router.Route(lb.Request{TokenIDs: ids, PromptTokens: estimate})
	took := time.Since(start)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "no instance can serve the request: "+err.Error())
		return
	}
	if p.observe != nil {
		p.observe(d, took)
	}
	h := w.Header()
	h.Set(PrefillNameHeader, d.Prefill)
	if d.Decode != "" {
		h.Set(DecodeNameHeader, d.Decode)
	}
	h.Set(PolicyHeader, d.Policy)
	h.Set(DecisionMicrosHeader, strconv.FormatInt(took.Microseconds(), 10))
	h.Set(HitRatioHeader, strconv.FormatFloat(d.HitRatio, 'f', 4, 64))
	p.forward(w, r, d, r.URL.Path, body)
}

// tokens returns the prompt's token ids when they can be known, else an
// estimate of its length for load-only routing.
func (p *proxy) tokens(req *completionRequest, chat bool) ([]uint32, int, error) {
	if chat {
		if len(req.Messages) == 0 {
			return nil, 0, errors.New("messages: must be a non-empty array")
		}
		msgs := make([]ChatMessage, len(req.Messages))
		chars := 0
		for i, m := range req.Messages {
			text, err := contentText(m.Content)
			if err != nil {
				return nil, 0, fmt.Errorf("messages[%d].content: %w", i, err)
			}
			msgs[i] = ChatMessage{Role: m.Role, Content: text}
			chars += len(text)
		}
		if p.tokenizer == nil {
			p.noTokenizer()
			return nil, chars / 4, nil
		}
		ids, err := p.tokenizer.EncodeChat(msgs, nil)
		if err != nil {
			p.log.Warn("chat template failed; routing by load only", "err", err)
			return nil, chars / 4, nil
		}
		return ids, 0, nil
	}
	if len(req.Prompt) == 0 {
		return nil, 0, errors.New("prompt: required")
	}
	// A prompt of token ids is used as is.
	var ids []uint32
	if req.Prompt[0] == '[' {
		var raw []int64
		if err := json.Unmarshal(req.Prompt, &raw); err == nil {
			ids = make([]uint32, len(raw))
			for i, v := range raw {
				if v < 0 || v > 1<<32-1 {
					return nil, 0, fmt.Errorf("prompt[%d]: token id %d out of range [0, 4294967295]", i, v)
				}
				ids[i] = uint32(v)
			}
			return ids, 0, nil
		}
		// Batched prompts: route by the first one.
		var batch []json.RawMessage
		if err := json.Unmarshal(req.Prompt, &batch); err != nil || len(batch) == 0 {
			return nil, 0, errors.New("prompt: must be a string, an array of token ids, or an array of those")
		}
		return p.tokens(&completionRequest{Prompt: batch[0]}, false)
	}
	var text string
	if err := json.Unmarshal(req.Prompt, &text); err != nil {
		return nil, 0, errors.New("prompt: must be a string, an array of token ids, or an array of those")
	}
	if p.tokenizer == nil {
		p.noTokenizer()
		return nil, len(text) / 4, nil
	}
	ids, err := p.tokenizer.Encode(text, nil)
	if err != nil {
		p.log.Warn("tokenizer failed; routing by load only", "err", err)
		return nil, len(text) / 4, nil
	}
	return ids, 0, nil
}

func (p *proxy) noTokenizer() {
	p.warnNoTokenizer.Do(func() {
		p.log.Warn("no --tokenizer_path: text and chat prompts are routed by load only (no prefix hits); token-id prompts keep cache-aware routing")
	})
}

// contentText accepts a string or an array of {"type":"text","text":…}
// parts; other parts (images) contribute no text.
func contentText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("must be a string or an array of content parts")
	}
	var b bytes.Buffer
	for _, p := range parts {
		if p.Type == "text" {
			b.WriteString(p.Text)
		}
	}
	return b.String(), nil
}

// forward relays body to the chosen engine and its answer back,
// streaming as it arrives; the client's cancellation cancels the
// engine request.
func (p *proxy) forward(w http.ResponseWriter, r *http.Request, d lb.Decision, path string, body []byte) {
	url := "http://" + d.Prefill + path
	out, err := http.NewRequestWithContext(r.Context(), r.Method, url, bytes.NewReader(body))
	if err != nil {
		writeError(w, http.StatusInternalServerError, "building engine request: "+err.Error())
		return
	}
	out.Header.Set("Content-Type", "application/json")
	if a := r.Header.Get("Accept"); a != "" {
		out.Header.Set("Accept", a)
	}
	out.Header.Set(PrefillNameHeader, d.Prefill)
	if d.Decode != "" {
		out.Header.Set(DecodeNameHeader, d.Decode)
	}
	resp, err := p.client.Do(out)
	if err != nil {
		code := http.StatusBadGateway
		if errors.Is(err, context.DeadlineExceeded) {
			code = http.StatusGatewayTimeout
		}
		if r.Context().Err() != nil {
			p.log.Debug("client went away before the engine answered", "engine", d.Prefill)
			return
		}
		writeError(w, code, fmt.Sprintf("engine %s: %v", d.Prefill, err))
		return
	}
	defer resp.Body.Close()
	for _, k := range []string{"Content-Type", "Cache-Control"} {
		if v := resp.Header.Get(k); v != "" {
			w.Header().Set(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	fw := flushWriter{w: w, f: http.NewResponseController(w)}
	if _, err := io.Copy(fw, resp.Body); err != nil && r.Context().Err() == nil {
		p.log.Warn("relaying the engine's answer failed", "engine", d.Prefill, "err", err)
	}
}

// flushWriter flushes after every write so SSE chunks reach the client
// as the engine sends them.
type flushWriter struct {
	w io.Writer
	f *http.ResponseController
}

func (fw flushWriter) Write(b []byte) (int, error) {
	n, err := fw.w.Write(b)
	if err == nil {
		_ = fw.f.Flush()
	}
	return n, err
}

// handleModels relays /v1/models from an instance chosen like a request
// of no known prompt.
func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	p := s.proxy
	if p == nil {
		writeError(w, http.StatusServiceUnavailable, "no router: kvcar runs without an instance registry")
		return
	}
	d, err := p.router.Route(lb.Request{})
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "no instance can serve the request: "+err.Error())
		return
	}
	p.forward(w, r, d, ModelsPath, nil)
}
