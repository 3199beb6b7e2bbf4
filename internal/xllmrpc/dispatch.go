package xllmrpc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvcar/kvcar/internal/baidustd"
	"github.com/kvcar/kvcar/internal/instance"
	"github.com/kvcar/kvcar/internal/xllmpb"
)

// Dispatcher defaults.
const (
	// DefaultOutputTimeout bounds the wait for a request's next
	// generation, the first included: an engine that says nothing for
	// this long has lost the request.
	DefaultOutputTimeout = 60 * time.Second
	// DefaultCallTimeout bounds the Completions call itself, which an
	// engine answers at once.
	DefaultCallTimeout = 5 * time.Second
	// livenessInterval is how often a waiting request checks that its
	// instances are still registered in the same incarnation.
	livenessInterval = 200 * time.Millisecond
)

// DispatcherOptions configures a Dispatcher.
type DispatcherOptions struct {
	// Self is kvcar's rpc address ("ip:rpc_port"), sent as
	// source_xservice_addr: where engines send the output. Required.
	Self string
	// Outputs is the registry the Service delivers Generations into.
	// Required.
	Outputs *Outputs
	// Registry, when set, ends a request at once with an error when the
	// instance serving it is removed, becomes SUSPECT or restarts (a new
	// incarnation), as xllm-service clears the requests of a failed
	// instance.
	Registry Registry
	// OutputTimeout: DefaultOutputTimeout when 0.
	OutputTimeout time.Duration
	// CallTimeout: DefaultCallTimeout when 0.
	CallTimeout time.Duration
	// Logger receives dispatch problems; nil discards them.
	Logger *slog.Logger
}

// Dispatcher sends OpenAI requests to xLLM engines over baidu_std as
// xllm-service does and writes the engines' output as the OpenAI
// response. Safe for concurrent use.
type Dispatcher struct {
	opts   DispatcherOptions
	log    *slog.Logger
	prefix string // of service_request_ids, unique per Dispatcher
	seq    atomic.Uint64

	mu      sync.Mutex
	clients map[string]*baidustd.Client // by instance name
	closed  bool
}

// NewDispatcher checks opts and makes a Dispatcher; Close releases its
// connections.
func NewDispatcher(opts DispatcherOptions) (*Dispatcher, error) {
	if opts.Self == "" || opts.Outputs == nil {
		return nil, errors.New("xllmrpc: DispatcherOptions.Self and Outputs are required")
	}
	if opts.OutputTimeout <= 0 {
		opts.OutputTimeout = DefaultOutputTimeout
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = DefaultCallTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("xllmrpc: request id prefix: %w", err)
	}
	return &Dispatcher{opts: opts, log: opts.Logger, prefix: "kvcar-" + hex.EncodeToString(b[:]) + "-",
		clients: make(map[string]*baidustd.Client)}, nil
}

// Close closes the connections to the engines; requests in flight fail.
func (d *Dispatcher) Close() error {
	d.mu.Lock()
	d.closed = true
	clients := d.clients
	d.clients = nil
	d.mu.Unlock()
	for _, c := range clients {
		c.Close()
	}
	return nil
}

// Request is one OpenAI request for xLLM instances, with the routing
// decision already taken.
type Request struct {
	// Chat is true for /v1/chat/completions, false for /v1/completions.
	Chat bool
	// Body is the client's JSON body.
	Body []byte
	// Prompt is the body's prompt or messages as the caller has read
	// them; nil makes the dispatcher read them from Body itself.
	Prompt *Prompt
	// TokenIDs are the prompt's token ids: a completions prompt given as
	// token ids, or kvcar's tokenizer's ids of a text or chat prompt
	// (chat template applied), sent as token_ids as xllm-service sends
	// its own. Empty sends the text alone, which the engine tokenizes.
	// A chat's ids are taken to be rendered from the messages' roles and
	// contents alone, so they are not sent when the request has tools
	// (unless tool_choice is "none"), chat_template_kwargs, or messages
	// with tool calls, tool call ids or reasoning, which xllm-service
	// renders and such ids leave out: the engine then renders and
	// tokenizes the chat itself.
	TokenIDs []uint32
	// Prefill is the instance the request is sent to (its name,
	// "ip:http_port", where it serves baidu_std); Decode the decode
	// instance, "" when the prefill instance decodes too.
	Prefill string
	Decode  string
	// Buffers, when set, are where the request is encoded; nil takes
	// buffers of the dispatcher's own.
	Buffers *Buffers
	// Sent, when set, is called once Body, Prompt, TokenIDs and Buffers
	// are no longer needed: the request has been written to the engine,
	// or failed before. The caller may then reuse their storage.
	Sent func()
}

// Client-facing texts of the failures that are the engine's, not the
// request's: which engine failed and why goes to the log only, as on the
// HTTP relay.
const (
	msgEngineFailed   = "upstream engine failed"
	msgEngineTimedOut = "upstream engine timed out"
)

// BackendXLLM is the backend_type of instances that take requests over
// baidu_std; it is the default when an instance names none.
const BackendXLLM = "xllm"

// Serves reports whether requests for the instance go through the
// Dispatcher: an xLLM engine, whose registered backend_type is "xllm" or
// absent. Others (backend_type "vllm", behind xllm-service's sidecar)
// take OpenAI HTTP. Without a Registry, or for an instance it does not
// know, the default backend is assumed.
func (d *Dispatcher) Serves(name string) bool {
	if d.opts.Registry == nil {
		return true
	}
	in, ok := d.opts.Registry.Snapshot().Lookup(name)
	return !ok || in.Meta.BackendType == "" || strings.EqualFold(in.Meta.BackendType, BackendXLLM)
}

// Serve sends req to its prefill instance and writes the OpenAI response
// to w as the output arrives: one JSON body, or SSE chunks and "data:
// [DONE]" when the request streams. A failure before any output is an
// HTTP error with a {"error":{"code","message"}} body: 400 for a body
// that cannot be sent (naming what is wrong), 502 for an instance that
// cannot be reached or left, 504 for one that stopped reporting, the
// engine's gen_status mapped as HTTPStatus maps it; after the stream
// began, it is an SSE error event that ends the stream. The texts name no
// engine; the details go to the log. When ctx ends (the client went
// away) the request is abandoned and its engine told so at its next
// Generations call. Serve returns what ended the request early, nil when
// it completed.
func (d *Dispatcher) Serve(ctx context.Context, req Request, w http.ResponseWriter) error {
	sent := false
	done := func() {
		if !sent {
			sent = true
			if req.Sent != nil {
				req.Sent()
			}
		}
	}
	defer done()
	id := d.prefix + strconv.FormatUint(d.seq.Add(1), 10)
	enc := req.Buffers
	if enc == nil {
		enc = getEncoder()
		defer putEncoder(enc)
	} else {
		enc.reset()
	}
	pr, err := d.build(req, id, enc)
	if err != nil {
		var bad *BadRequestError
		if errors.As(err, &bad) {
			writeHTTPError(w, http.StatusBadRequest, err.Error())
			return err
		}
		d.log.Error("encoding a request for an xLLM engine failed", "err", err)
		writeHTTPError(w, http.StatusInternalServerError, "internal error")
		return err
	}
	q, err := d.opts.Outputs.open(id)
	if err != nil {
		d.log.Error("request id already waiting", "err", err)
		writeHTTPError(w, http.StatusInternalServerError, "internal error")
		return err
	}
	defer d.opts.Outputs.close(id, q)

	watch, err := d.bind(req)
	if err == nil {
		err = d.send(ctx, req, pr, id, enc.msg)
	}
	done()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		d.log.Warn("engine request failed", "engine", req.Prefill, "service_request_id", id, "err", err)
		code, msg := http.StatusBadGateway, msgEngineFailed
		if baidustd.CodeOf(err) == baidustd.ERPCTIMEDOUT {
			code, msg = http.StatusGatewayTimeout, msgEngineTimedOut
		}
		writeHTTPError(w, code, msg)
		return err
	}
	out := newResponder(w, pr, time.Now().Unix())
	return d.collect(ctx, req, id, q, watch, out)
}

// build turns the request into its xLLM message, in enc.msg.
func (d *Dispatcher) build(req Request, id string, enc *encoder) (*parsedRequest, error) {
	if req.Prefill == "" {
		return nil, badRequest("no prefill instance in the routing decision")
	}
	p, ids := req.Prompt, req.TokenIDs
	if p == nil {
		var own []uint32
		var err error
		if p, own, err = readPrompt(req.Chat, req.Body); err != nil {
			return nil, err
		}
		if len(ids) == 0 {
			ids = own
		}
	}
	if p.Start < 0 || p.End < p.Start || p.End > len(req.Body) {
		return nil, fmt.Errorf("prompt span [%d, %d) outside a body of %d bytes", p.Start, p.End, len(req.Body))
	}
	if err := checkIDs(ids); err != nil {
		return nil, err
	}
	// The other members are read from the body without the prompt, which
	// is the bulk of it and is read already.
	enc.rest = append(append(append(enc.rest[:0], req.Body[:p.Start]...), "null"...), req.Body[p.End:]...)
	routing := &xllmpb.Routing{PrefillName: req.Prefill, DecodeName: req.Decode}
	self := d.opts.Self
	if req.Chat {
		small, pr, err := chatMessage(enc.rest)
		if err != nil {
			return nil, err
		}
		if len(p.Messages) == 0 {
			return nil, badRequest("messages is required and must not be empty")
		}
		for i, m := range p.Messages {
			if len(m.Role) == 0 {
				return nil, badRequest("messages[%d].role is required", i)
			}
			var extra *xllmpb.ChatMessage
			if m.Raw != nil {
				if extra, err = extrasOf(m.Raw, i); err != nil {
					return nil, err
				}
			}
			enc.extras = append(enc.extras, extra)
		}
		if !renderedFromMessages(small, enc.extras) {
			ids = nil
		}
		small.ServiceRequestId, small.Routing, small.SourceXserviceAddr = &id, routing, &self
		return pr, enc.encodeChat(small, p.Messages, ids)
	}
	small, pr, err := completionMessage(enc.rest)
	if err != nil {
		return nil, err
	}
	switch {
	case p.Count > 1:
		return nil, badRequest("prompt holds %d prompts: send one per request", p.Count)
	case len(p.Text) == 0 && len(ids) == 0:
		return nil, badRequest("prompt is empty")
	}
	small.ServiceRequestId, small.Routing, small.SourceXserviceAddr = &id, routing, &self
	return pr, enc.encodeCompletion(small, p.Text, ids)
}

// renderedFromMessages reports whether the chat's prompt is rendered from
// its messages' roles and contents alone: no tools for the template, no
// template arguments, no message members the template may render.
func renderedFromMessages(small *xllmpb.ChatRequest, extras []*xllmpb.ChatMessage) bool {
	if (len(small.GetTools()) > 0 && small.GetToolChoice() != "none") || small.GetChatTemplateKwargs() != nil {
		return false
	}
	for _, e := range extras {
		if e != nil {
			return false
		}
	}
	return true
}

// watched is an instance a request depends on, in the incarnation it
// was sent to.
type watched struct {
	name        string
	incarnation string
	prefill     bool // only until the prefill stage has finished
}

// bind records the incarnations of the request's instances, as
// xllm-service binds a request to them before dispatch.
func (d *Dispatcher) bind(req Request) ([]watched, error) {
	if d.opts.Registry == nil {
		return nil, nil
	}
	snap := d.opts.Registry.Snapshot()
	var out []watched
	for _, w := range []watched{{name: req.Prefill, prefill: req.Decode != ""}, {name: req.Decode}} {
		if w.name == "" {
			continue
		}
		in, ok := snap.Lookup(w.name)
		if !ok || !in.Schedulable() {
			return nil, fmt.Errorf("instance %s is not registered or not schedulable", w.name)
		}
		w.incarnation = in.Incarnation()
		out = append(out, w)
	}
	return out, nil
}

// gone says why a watched instance can no longer finish the request, ""
// while it can.
func (d *Dispatcher) gone(watch []watched, prefillDone bool) string {
	if d.opts.Registry == nil {
		return ""
	}
	snap := d.opts.Registry.Snapshot()
	for _, w := range watch {
		if w.prefill && prefillDone {
			continue
		}
		in, ok := snap.Lookup(w.name)
		switch {
		case !ok:
			return fmt.Sprintf("instance %s left the registry before finishing the request", w.name)
		case in.State == instance.Suspect:
			return fmt.Sprintf("instance %s is SUSPECT: it lost its lease and does not answer", w.name)
		case in.Incarnation() != w.incarnation:
			return fmt.Sprintf("instance %s restarted (incarnation %q, was %q) and lost the request", w.name, in.Incarnation(), w.incarnation)
		}
	}
	return ""
}

// send makes the Completions or ChatCompletions call with the encoded
// message; the engine answers it at once and sends the output later.
func (d *Dispatcher) send(ctx context.Context, req Request, pr *parsedRequest, id string, msg []byte) error {
	c, err := d.client(req.Prefill)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, d.opts.CallTimeout)
	defer cancel()
	method := xllmpb.MethodCompletions
	if pr.chat {
		method = xllmpb.MethodChatCompletions
	}
	if _, err := c.Call(cctx, xllmpb.APIService, method, msg, nil); err != nil {
		return fmt.Errorf("instance %s, %s: %w", req.Prefill, method, err)
	}
	return nil
}

// client is the one connection to an instance.
func (d *Dispatcher) client(name string) (*baidustd.Client, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, errors.New("dispatcher closed")
	}
	if c := d.clients[name]; c != nil {
		return c, nil
	}
	d.pruneLocked()
	c := baidustd.NewClient(name, baidustd.ClientOptions{Logger: d.log})
	d.clients[name] = c
	return c, nil
}

// pruneLocked closes the connections to instances no longer registered,
// so that the clients kept are bounded by the registry's size.
func (d *Dispatcher) pruneLocked() {
	if d.opts.Registry == nil || len(d.clients) < 64 {
		return
	}
	snap := d.opts.Registry.Snapshot()
	if len(d.clients) < 2*len(snap.Instances) {
		return
	}
	for name, c := range d.clients {
		if _, ok := snap.Lookup(name); !ok {
			c.Close()
			delete(d.clients, name)
		}
	}
}

// collect turns the request's generations into the response until it
// finishes, fails, times out or its client goes.
func (d *Dispatcher) collect(ctx context.Context, req Request, id string, q *outputQueue, watch []watched, out *responder) error {
	timeout := time.NewTimer(d.opts.OutputTimeout)
	defer timeout.Stop()
	var tick <-chan time.Time
	if len(watch) > 0 {
		t := time.NewTicker(livenessInterval)
		defer t.Stop()
		tick = t.C
	}
	prefillDone := false
	source := req.Prefill
	// fail ends the response with the client's text and logs the detail.
	fail := func(code int, public, detail string) error {
		d.log.Warn("engine request failed", "engine", source, "service_request_id", id, "status", code, "err", detail)
		out.fail(code, public)
		return fmt.Errorf("%s (HTTP %d)", detail, code)
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timeout.C:
			return fail(http.StatusGatewayTimeout, msgEngineTimedOut,
				fmt.Sprintf("no output from instance %s for %v", source, d.opts.OutputTimeout))
		case <-tick:
			if why := d.gone(watch, prefillDone); why != "" {
				return fail(http.StatusBadGateway, msgEngineFailed, why)
			}
		case <-q.notify:
			gens, err := q.take()
			if err != nil {
				// The client's own doing: it names no engine.
				return fail(http.StatusInternalServerError, err.Error(), err.Error())
			}
			for _, g := range gens {
				if st := g.GetGenStatus(); st.GetStatusCode() != 0 {
					code := st.GetStatusCode()
					return fail(HTTPStatus(code), genStatusText(code, st.GetStatusMsg()),
						fmt.Sprintf("instance %s: %s (status %d %s)", source, st.GetStatusMsg(), code, statusName(code)))
				}
				if g.GetFinishedOnPrefillInstance() && !prefillDone {
					prefillDone = true
					if req.Decode != "" {
						source = req.Decode
					}
				}
				done, err := out.add(g)
				if err != nil || done {
					return err
				}
			}
			if err := out.flushStream(); err != nil {
				return err
			}
			if !timeout.Stop() {
				select {
				case <-timeout.C:
				default:
				}
			}
			timeout.Reset(d.opts.OutputTimeout)
		}
	}
}

// genStatusText is what the client is told of an engine's error status.
// An INVALID_ARGUMENT is about the request ("Prompt is too long"), so the
// engine's words go with it, as xllm-service passes them on; the others
// are the engine's own trouble and may name instances, so only the
// status's name goes.
func genStatusText(code int32, msg string) string {
	if code == 3 && msg != "" {
		return "the engine refused the request: " + msg
	}
	return msgEngineFailed + " (" + statusName(code) + ")"
}

// HTTPStatus maps an engine's gen_status code (xllm::StatusCode) to the
// HTTP status of the client's answer.
func HTTPStatus(code int32) int {
	switch code {
	case 1: // CANCELLED: the engine dropped the request
		return http.StatusBadGateway
	case 3: // INVALID_ARGUMENT
		return http.StatusBadRequest
	case 4: // DEADLINE_EXCEEDED
		return http.StatusGatewayTimeout
	case 5, 6: // RESOURCE_EXHAUSTED, UNAVAILABLE
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError // 2 UNKNOWN and codes this version does not know
}

var statusNames = map[int32]string{1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
	5: "RESOURCE_EXHAUSTED", 6: "UNAVAILABLE"}

func statusName(code int32) string {
	if n, ok := statusNames[code]; ok {
		return n
	}
	return "code " + strconv.Itoa(int(code))
}

// writeHTTPError sends kvcar's error body, {"error":{"code","message"}}.
func writeHTTPError(w http.ResponseWriter, code int, msg string) {
	b, _ := json.Marshal(errorJSON(code, msg))
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

func errorJSON(code int, msg string) map[string]any {
	return map[string]any{"error": map[string]any{"code": code, "message": msg}}
}
