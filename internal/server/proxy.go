package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/kvcar/kvcar/internal/budget"
	"github.com/kvcar/kvcar/internal/jsonw"
	"github.com/kvcar/kvcar/internal/lb"
	"github.com/kvcar/kvcar/internal/xllmrpc"
)

// Routes of the OpenAI-compatible request path.
const (
	CompletionsPath     = "/v1/completions"
	ChatCompletionsPath = "/v1/chat/completions"
	ModelsPath          = "/v1/models"
)

// Headers that carry the routing decision to the engine (WIRE.md
// routing{prefill_name, decode_name}) and, with ExposeRoutingHeaders, report
// it to the client.
const (
	PrefillNameHeader    = "X-Prefill-Name"
	DecodeNameHeader     = "X-Decode-Name"
	PolicyHeader         = "X-Kvcar-Policy"
	DecisionMicrosHeader = "X-Kvcar-Decision-Us"
	HitRatioHeader       = "X-Kvcar-Hit-Ratio"
)

// Request path limits, the defaults of the Options that set them.
const (
	// DefaultMaxRequestBodyBytes bounds a completion body: DefaultMaxTokenIDs
	// ids of the widest form, "4294967295,", take 11 MiB, and the rest is
	// room for the other fields.
	DefaultMaxRequestBodyBytes = 16 << 20
	// DefaultMaxInflightRequestBytes bounds the completion body bytes held
	// at once across all requests: eight bodies at the limit, or thousands
	// of ordinary ones (a 2k-token prompt is about 12 KB).
	DefaultMaxInflightRequestBytes = 128 << 20
	// DefaultMaxPromptTextBytes bounds the text of one request given to
	// the tokenizer: about 250k tokens of English. Tokenizing is the
	// costliest step per byte: a 1 MiB word of spaces costs about 1 s of
	// CPU and 49 MiB of allocations.
	DefaultMaxPromptTextBytes = 1 << 20
)

// engineIdleConnTimeout closes kvcar's idle connections to an engine
// before the engine does, so that a request is not written to a
// connection the engine is closing: uvicorn-based engines close after 5 s
// idle, brpc and Go servers later or never.
const engineIdleConnTimeout = 4 * time.Second

// maxEngineAttempts bounds the tries of one request on an engine: a
// request that was never written, on a connection the engine had closed,
// is sent again on another.
const maxEngineAttempts = 3

// Router makes a routing decision from in-process state only: the
// registry snapshot and the KV directory (R-DIR-4). It must not block.
// A Router that is also an lb.Releaser is told when the request of a
// decision with a Ticket has ended.
type Router interface {
	Policy() string
	Route(req lb.Request) (lb.Decision, error)
}

// Tokenizer turns text and chat messages into the token ids the engine
// will see, so that CAR can look up their prefix. It returns ctx's error
// soon after ctx ends.
type Tokenizer interface {
	Encode(ctx context.Context, text string, dst []uint32) ([]uint32, error)
	EncodeChat(ctx context.Context, messages []ChatMessage, dst []uint32) ([]uint32, error)
}

// Dispatcher sends requests to the engines that take them over xLLM's own
// RPC (brpc baidu_std Completions and ChatCompletions, output back
// through Generations) instead of OpenAI HTTP, and writes their answer;
// *xllmrpc.Dispatcher is one.
type Dispatcher interface {
	// Serves reports whether the instance's requests go through the
	// Dispatcher: an xLLM engine, by its registered backend_type.
	Serves(instance string) bool
	// Serve sends req and writes the OpenAI answer, or an error that
	// names no engine, to w. It calls req.Sent once it no longer reads
	// req's body, prompt or ids, and returns what ended the request
	// early.
	Serve(ctx context.Context, req xllmrpc.Request, w http.ResponseWriter) error
}

// ChatMessage is one chat turn with its text content.
type ChatMessage struct {
	Role, Content string
}

// proxy is the request path: parse, decide, forward, relay.
type proxy struct {
	router          Router
	tokenizer       Tokenizer
	dispatcher      Dispatcher
	engines         *engineClient
	log             *slog.Logger
	warnNoTokenizer sync.Once
	observe         func(d lb.Decision, took time.Duration)

	maxBody       int64
	maxIDs        int
	maxText       int
	exposeHeaders bool
	budget        *budget.Bytes
	buffers       freeList[*inferenceBuffers]
	// copyBufs are what bodies and answers are copied through.
	copyBufs freeList[*copyBuf]
}

// copyBuf is a buffer bodies and answers are copied through.
type copyBuf struct{ b [readChunk]byte }

// Kept buffers above these sizes are dropped rather than kept, so that
// one huge request does not pin its memory; all kept buffers together are
// bounded by these totals.
const (
	maxPooledBody     = 1 << 20
	maxPooledIDs      = 1 << 18
	maxPooledBytes    = 32 << 20
	maxPooledCopyBufs = 256
)

// inferenceBuffers are one request's pooled storage: the body as read,
// what the parse found, and the body relayed when it had to be rewritten.
type inferenceBuffers struct {
	body []byte
	in   inference
	// relay is the body sent to the engine when kvcar's routing value
	// replaces a client's; head is the request's HTTP head.
	relay []byte
	head  []byte
	msgs  []ChatMessage
	// prompt and xmsgs are what a dispatched request's prompt is handed
	// over in.
	prompt xllmrpc.Prompt
	xmsgs  []xllmrpc.Message
	// enc is where a dispatched request's message is encoded.
	enc xllmrpc.Buffers
	// held is what the body took from the in-flight budget.
	held int64
}

func newProxy(opts Options, maxIDs int, log *slog.Logger) *proxy {
	p := &proxy{
		router:     opts.Router,
		tokenizer:  opts.Tokenizer,
		dispatcher: opts.Dispatcher,
		// Redirects are relayed, not followed: kvcar sends requests only
		// to the engine it chose.
		engines:       newEngineClient(),
		log:           log,
		maxBody:       opts.MaxRequestBodyBytes,
		maxIDs:        maxIDs,
		maxText:       opts.MaxPromptTextBytes,
		exposeHeaders: opts.ExposeRoutingHeaders,
	}
	if p.maxBody <= 0 {
		p.maxBody = DefaultMaxRequestBodyBytes
	}
	if p.maxText <= 0 {
		p.maxText = DefaultMaxPromptTextBytes
	}
	inflight := opts.MaxInflightRequestBytes
	if inflight <= 0 {
		inflight = DefaultMaxInflightRequestBytes
	}
	// A body at the limit must fit, or it could never be served.
	p.budget = budget.New(max(inflight, p.maxBody+1))
	p.buffers = freeList[*inferenceBuffers]{maxBytes: maxPooledBytes,
		newItem: func() *inferenceBuffers { return &inferenceBuffers{} }, size: (*inferenceBuffers).size}
	p.copyBufs = freeList[*copyBuf]{maxBytes: maxPooledCopyBufs * readChunk,
		newItem: func() *copyBuf { return new(copyBuf) }, size: func(*copyBuf) int64 { return readChunk }}
	return p
}

// release gives back b's budget and keeps it for reuse, without the
// buffers that grew too large to keep.
func (p *proxy) release(b *inferenceBuffers) {
	p.budget.Give(b.held)
	b.held = 0
	if cap(b.body) > maxPooledBody {
		b.body = nil
	}
	if cap(b.relay) > maxPooledBody {
		b.relay = nil
	}
	if cap(b.in.ids) > maxPooledIDs {
		b.in.ids = nil
	}
	if cap(b.in.text) > maxPooledBody {
		b.in.text = nil
	}
	if cap(b.in.msgs) > 1024 {
		b.in.msgs = nil
	}
	clear(b.msgs[:cap(b.msgs)])
	b.msgs = b.msgs[:0]
	clear(b.xmsgs[:cap(b.xmsgs)])
	if cap(b.xmsgs) > 1024 {
		b.xmsgs = nil
	}
	b.xmsgs = b.xmsgs[:0]
	b.prompt = xllmrpc.Prompt{}
	if b.enc.Size() > maxPooledBody {
		b.enc = xllmrpc.Buffers{}
	}
	p.buffers.put(b)
}

// size is about the memory b keeps.
func (b *inferenceBuffers) size() int64 {
	return int64(cap(b.body) + 4*cap(b.in.ids) + cap(b.in.text) + 48*cap(b.in.msgs) + cap(b.in.stack) +
		cap(b.relay) + cap(b.head) + 32*cap(b.msgs) + 72*cap(b.xmsgs) + b.enc.Size())
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
	if r.ContentLength > p.maxBody {
		writeError(w, http.StatusRequestEntityTooLarge, "request body exceeds "+strconv.FormatInt(p.maxBody, 10)+" bytes")
		return
	}
	b := p.buffers.get()
	sc := scanner{r: http.MaxBytesReader(w, r.Body, p.maxBody), buf: b.body[:cap(b.body)], limit: p.maxBody,
		keep: true, budget: p.budget}
	if r.ContentLength >= 0 {
		// A body of known length is taken from the budget whole, before
		// any of it is read; the extra byte is where its end is seen.
		n := r.ContentLength + 1
		if !p.budget.Take(n) {
			p.buffers.put(b)
			busy(w)
			return
		}
		sc.held = n
		if int64(len(sc.buf)) < n {
			sc.buf = make([]byte, n)
		}
		// Exactly what the budget holds, so that the body is read in as
		// few reads as it arrives in.
		sc.buf = sc.buf[:n]
	}
	b.in.reset()
	chat := r.URL.Path == ChatCompletionsPath
	// The text is kept for the tokenizer, bounded by its limit, and for an
	// xLLM engine, whose message carries it.
	lim := inferenceLimits{maxIDs: p.maxIDs, keepText: p.tokenizer != nil || p.dispatcher != nil, maxText: p.maxText}
	if p.tokenizer == nil {
		lim.maxText = int(p.maxBody)
	}
	perr := parseInference(&sc, &b.in, chat, lim)
	b.body, b.held = sc.buf, sc.held
	if perr != nil {
		p.release(b)
		if perr.status == http.StatusServiceUnavailable {
			busy(w)
			return
		}
		writeError(w, perr.status, perr.message)
		return
	}
	ids, estimate, perr := p.promptTokens(r.Context(), b, chat)
	if perr != nil {
		p.release(b)
		if r.Context().Err() != nil {
			p.log.Debug("client went away while its prompt was tokenized")
			return
		}
		writeError(w, perr.status, perr.message)
		return
	}

	start := time.Now()
	d, err := p.router.Route(lb.Request{TokenIDs: ids, PromptTokens: estimate})
	took := time.Since(start)
	if err != nil {
		p.release(b)
		writeError(w, http.StatusServiceUnavailable, "no instance can serve the request: "+err.Error())
		return
	}
	if p.observe != nil {
		p.observe(d, took)
	}
	if rel, ok := p.router.(lb.Releaser); ok && d.Ticket != 0 {
		// The policy counts the request until it ends.
		defer rel.Release(d)
	}
	if p.exposeHeaders {
		h := w.Header()
		h.Set(PrefillNameHeader, d.Prefill)
		if d.Decode != "" {
			h.Set(DecodeNameHeader, d.Decode)
		}
		h.Set(PolicyHeader, d.Policy)
		h.Set(DecisionMicrosHeader, strconv.FormatInt(took.Microseconds(), 10))
		h.Set(HitRatioHeader, strconv.FormatFloat(d.HitRatio, 'f', 4, 64))
	}
	if p.dispatcher != nil && p.dispatcher.Serves(d.Prefill) {
		p.dispatch(w, r, d, b, sc.end, ids, chat)
		return
	}
	p.forward(w, r, d, r.URL.Path, b, sc.end)
}

// dispatch hands the request to the dispatcher with what the parse
// found, so that the prompt is copied once, into the engine's message. b
// holds the body (its first n bytes) and ids; it is released, its budget
// with it, as soon as the dispatcher has written the request to the
// engine, so that a long answer holds none of it.
func (p *proxy) dispatch(w http.ResponseWriter, r *http.Request, d lb.Decision, b *inferenceBuffers, n int, ids []uint32, chat bool) {
	in := &b.in
	body := b.body[:n]
	b.prompt = xllmrpc.Prompt{Start: in.promptStart, End: in.promptEnd, Count: in.prompts}
	if chat {
		msgs := b.xmsgs[:0]
		for _, m := range in.msgs {
			xm := xllmrpc.Message{Role: in.text[m.roleStart:m.roleEnd], Content: in.text[m.contentStart:m.contentEnd]}
			if m.other {
				xm.Raw = body[m.objStart:m.objEnd]
			}
			msgs = append(msgs, xm)
		}
		b.xmsgs = msgs
		b.prompt.Messages = msgs
	} else if !in.hasIDs {
		b.prompt.Text = in.text
	}
	released := false
	release := func() {
		if !released {
			released = true
			p.release(b)
		}
	}
	defer release()
	err := p.dispatcher.Serve(r.Context(), xllmrpc.Request{Chat: chat, Body: body, Prompt: &b.prompt, TokenIDs: ids,
		Prefill: d.Prefill, Decode: d.Decode, Buffers: &b.enc, Sent: release}, w)
	if err != nil {
		// The dispatcher has logged the engine's failures; what is left is
		// the client's doing.
		p.log.Debug("dispatched request ended early", "engine", d.Prefill, "err", err)
	}
}

// busy refuses a request the in-flight budget cannot take.
func busy(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	writeError(w, http.StatusServiceUnavailable, "too many request bytes in flight; retry later")
}

// promptTokens returns the prompt's token ids when they can be known, else
// an estimate of its length for load-only routing. The ids live in b.
func (p *proxy) promptTokens(ctx context.Context, b *inferenceBuffers, chat bool) ([]uint32, int, *requestError) {
	in := &b.in
	if in.hasIDs {
		return in.ids, 0, nil
	}
	if p.tokenizer == nil {
		p.noTokenizer()
		return nil, in.textLen / 4, nil
	}
	var ids []uint32
	var err error
	if chat {
		msgs := b.msgs[:0]
		for _, m := range in.msgs {
			msgs = append(msgs, ChatMessage{Role: string(in.text[m.roleStart:m.roleEnd]),
				Content: string(in.text[m.contentStart:m.contentEnd])})
		}
		b.msgs = msgs
		ids, err = p.tokenizer.EncodeChat(ctx, msgs, in.ids[:0])
	} else {
		ids, err = p.tokenizer.Encode(ctx, string(in.text), in.ids[:0])
	}
	if cap(ids) > cap(in.ids) {
		in.ids = ids[:0]
	}
	if err != nil {
		if ctx.Err() != nil {
			// Nobody reads this: the client has gone.
			return nil, 0, &requestError{status: 499, message: "client went away"}
		}
		p.log.Warn("tokenizer failed; routing by load only", "chat", chat, "err", err)
		return nil, in.textLen / 4, nil
	}
	if len(ids) > p.maxIDs {
		return nil, 0, badRequest("prompt: more than %d ids once tokenized", p.maxIDs)
	}
	return ids, 0, nil
}

func (p *proxy) noTokenizer() {
	p.warnNoTokenizer.Do(func() {
		p.log.Warn("no --tokenizer_path: text and chat prompts are routed by load only (no prefix hits); token-id prompts keep cache-aware routing")
	})
}

// forward relays the request to the chosen engine and its answer back,
// streaming as it arrives; the client's cancellation cancels the engine
// request. b holds the body (its first n bytes) and is released here, as
// soon as the engine has it all; nil b sends no body.
func (p *proxy) forward(w http.ResponseWriter, r *http.Request, d lb.Decision, path string, b *inferenceBuffers, n int) {
	var body []byte
	var head []byte
	length := -1
	if b != nil {
		body = b.body[:n]
		if in := &b.in; in.routingStart >= 0 {
			// A client's routing value is rare: the body is copied around
			// kvcar's so that it goes out in one piece.
			rb := append(b.relay[:0], body[:in.routingStart]...)
			rb = appendRouting(rb, d)
			b.relay = append(rb, body[in.routingEnd:]...)
			body = b.relay
		}
		length = len(body)
		head = b.head[:0]
	}
	ctype := ""
	if b != nil {
		ctype = "application/json"
	}
	head = appendRequestHead(head, r.Method, d.Prefill, path, length,
		"Content-Type", ctype, "Accept", r.Header.Get("Accept"), PrefillNameHeader, d.Prefill, DecodeNameHeader, d.Decode)
	if b != nil {
		b.head = head
	}
	kc, tries, err := p.engines.roundTrip(r.Context(), d.Prefill, r.Method, head, body)
	// The engine has the whole body once its answer's head is here, or
	// the request failed: either way the body is not needed any more, and
	// a long answer should not hold it.
	if b != nil {
		p.release(b)
	}
	if err != nil {
		if r.Context().Err() != nil {
			p.log.Debug("client went away before the engine answered", "engine", d.Prefill)
			return
		}
		// The details name the engine: they go to the log, not to the
		// client.
		p.log.Warn("engine request failed", "engine", d.Prefill, "path", path, "tries", tries, "err", err)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			writeError(w, http.StatusGatewayTimeout, "upstream engine timed out")
			return
		}
		writeError(w, http.StatusBadGateway, "upstream engine failed")
		return
	}
	// The values are the connection's, shared with the next answer on
	// it: neither side ever writes into them.
	ans := &kc.ans
	h := w.Header()
	if len(ans.contentType) > 0 {
		h["Content-Type"] = ans.contentType
	}
	if len(ans.cacheControl) > 0 {
		h["Cache-Control"] = ans.cacheControl
	}
	// An answer of known length is whole once the engine has sent it: it
	// goes out with its length, in as few writes as it takes, and the
	// connection's buffer is flushed once, when the handler returns. One
	// of unknown length (SSE, chunked) is flushed write by write, so that
	// each event reaches the client as the engine sends it.
	var dst io.Writer = w
	if ans.length >= 0 {
		if len(ans.contentLength) > 0 {
			h["Content-Length"] = ans.contentLength
		}
	} else {
		dst = flushWriter{w: w, f: http.NewResponseController(w)}
	}
	w.WriteHeader(ans.status)
	cb := p.copyBufs.get()
	defer p.copyBufs.put(cb)
	_, err = io.CopyBuffer(dst, ans.body, cb.b[:])
	// The connection is kept only when the answer was read whole.
	p.engines.finish(kc, err == nil)
	if err != nil {
		if r.Context().Err() != nil {
			return // the client left: there is no one to tell
		}
		p.log.Warn("relaying the engine's answer failed", "engine", d.Prefill, "err", err)
		// The client must not take what it got for the whole answer
		// (RFC 9112 8): returning would end a chunked answer with its
		// last chunk. Aborting closes the client's connection with the
		// answer cut, as net/http's ReverseProxy does.
		panic(http.ErrAbortHandler)
	}
}

// appendRouting appends kvcar's routing value, which replaces the one a
// client sent: kvcar owns the routing it relays.
func appendRouting(b []byte, d lb.Decision) []byte {
	b = append(b, `{"prefill_name":`...)
	b = jsonw.String(b, d.Prefill)
	b = append(b, `,"decode_name":`...)
	b = jsonw.String(b, d.Decode)
	return append(b, '}')
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
	p.forward(w, r, d, ModelsPath, nil, 0)
}
