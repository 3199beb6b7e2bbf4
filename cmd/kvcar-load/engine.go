package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvcar/kvcar/internal/devcluster"
	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/server"
)

// answerHead opens every answer of a trivial engine, whole or one event
// of a stream: an OpenAI text completion's members up to its text.
const answerHead = `{"id":"cmpl-load","object":"text_completion","created":0,"model":"load","choices":[{"index":0,"text":"`

// completion is the whole answer of a trivial engine that writes tokens
// output tokens at once.
func completion(tokens int) string {
	return answerHead + strings.Repeat(" ok", tokens) + `","logprobs":null,"finish_reason":"length"}],` +
		`"usage":{"prompt_tokens":0,"completion_tokens":` + strconv.Itoa(tokens) + `,"total_tokens":` + strconv.Itoa(tokens) + `}}`
}

// tokenEvent is one event of a trivial engine's streamed answer, as vLLM
// writes them: one token, and finish, a JSON value, as its finish reason
// (null but for the last).
func tokenEvent(finish string) string {
	return "data: " + answerHead + ` ok","logprobs":null,"finish_reason":` + finish + "}]}\n\n"
}

// doneEvent ends a streamed answer.
const doneEvent = "data: [DONE]\n\n"

// Backends of the engines a run uses.
const (
	backendVLLM = "vllm"
	backendXLLM = "xllm"
)

// fleet is the engines of a run.
type fleet struct {
	// urls are the engines' completion URLs, for the direct cells.
	urls []string
	// synced waits until kvcar's stream of every engine is synchronised.
	synced func(ctx context.Context, kv *devcluster.KVCar) error
	close  func() error
}

// startTrivialFleet starts o.engines trivial engines that report their
// load to kvcarInternal.
func startTrivialFleet(etcd []string, kvcarInternal string, o options) (*fleet, error) {
	var es []*trivialEngine
	f := &fleet{close: func() error {
		var errs []error
		for _, e := range es {
			errs = append(errs, e.close())
		}
		return errors.Join(errs...)
	}}
	for range o.engines {
		e, err := startTrivialEngine(etcd, 200*time.Millisecond, kvcarInternal, o.engineIdle, o.maxTokens, o.stream)
		if err != nil {
			return nil, errors.Join(err, f.close())
		}
		es = append(es, e)
		f.urls = append(f.urls, "http://"+e.addr+server.CompletionsPath)
	}
	// A vLLM stream without a replay endpoint is synchronised from its
	// first live message on, so each engine announces a block until kvcar
	// is: its subscription may not have reached the engine at the first
	// tries.
	f.synced = func(ctx context.Context, kv *devcluster.KVCar) error {
		deadline := time.Now().Add(60 * time.Second)
		block := make([]uint32, 128)
		for i := 0; ; i++ {
			for _, e := range es {
				block[0] = uint32(i)
				if err := e.announce(block); err != nil {
					return err
				}
			}
			err := kv.WaitSynced(ctx, len(es), 200*time.Millisecond)
			if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
				return err
			}
		}
	}
	return f, nil
}

// startXLLMFleet starts o.engines emulated xLLM engines: kvcar dispatches
// to them over baidu_std and they answer through Generations calls.
// Unlike the trivial engines they do an engine's bookkeeping for every
// request (the ids decoded, the prompt's blocks hashed and cached, their
// KV events published, which kvcar applies), at next to no emulated
// time, so the direct cells and kvcar's CPU include that work.
func startXLLMFleet(etcd []string, _ string, o options) (*fleet, error) {
	var cfgs []enginesim.Config
	for range o.engines {
		cfgs = append(cfgs, devcluster.Discoverable(enginesim.Config{
			TimeScale: 1e-6, BatchSlots: 256, MaxQueue: 1 << 16,
		}, etcd, "", 200*time.Millisecond))
	}
	es, err := devcluster.StartEngines(cfgs)
	if err != nil {
		return nil, err
	}
	f := &fleet{close: es.Close, synced: func(ctx context.Context, kv *devcluster.KVCar) error {
		return kv.WaitSynced(ctx, es.Streams(), 60*time.Second)
	}}
	for _, e := range es {
		f.urls = append(f.urls, "http://"+e.HTTPAddr()+server.CompletionsPath)
	}
	return f, nil
}

// trivialEngine is an OpenAI server that answers every completion at
// once, so that what a run measures is kvcar's request path and not an
// engine's work: it reads the body and writes a fixed answer. An
// emulated engine under the same name registers it in etcd as
// xllm-service's vLLM sidecar does, reports its load to kvcar and binds
// the KV event endpoint kvcar's discovery derives from its port (it
// publishes only what announce gives it: no request reaches it).
type trivialEngine struct {
	addr string
	// tokens is the output of every answer, streamed an event a token
	// when stream (each flushed, as vLLM flushes them); answer is the
	// whole unstreamed answer, event and lastEvent a streamed one's.
	tokens           int
	stream           bool
	answer           string
	event, lastEvent string
	srv              *http.Server
	reg              *enginesim.Engine
	// served is closed when Serve has returned.
	served chan struct{}
	bufs   sync.Pool
}

// startTrivialEngine starts one trivial engine. idle is its keep-alive
// idle timeout: uvicorn-based engines close an idle connection after 5 s,
// and kvcar must close its own first. Every answer has tokens output
// tokens, streamed when stream.
func startTrivialEngine(etcd []string, heartbeat time.Duration, kvcarInternal string, idle time.Duration, tokens int, stream bool) (*trivialEngine, error) {
	off := enginesim.DefaultDiscoveryOffsets()
	port, err := enginesim.FreeDiscoveryPort(1, off.Event, off.Replay)
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("trivial engine: %w", err)
	}
	e := &trivialEngine{addr: addr, tokens: tokens, stream: stream, answer: completion(tokens),
		event: tokenEvent("null"), lastEvent: tokenEvent(`"length"`), served: make(chan struct{}),
		bufs: sync.Pool{New: func() any { return new([32 << 10]byte) }}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", e.complete)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	e.srv = &http.Server{Handler: mux, IdleTimeout: idle, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(e.served)
		_ = e.srv.Serve(ln)
	}()

	// The registrar has no HTTP server of its own: the instance it
	// registers is the trivial engine's address, and its one rank binds
	// the endpoints discovery derives from that address's port.
	c := devcluster.VLLMSidecar(enginesim.Config{Name: addr}, etcd, "", heartbeat, kvcarInternal)
	c.DiscoveryOffsets = nil
	if c.EventEndpoints, c.ReplayEndpoints, err = enginesim.DiscoveryEndpoints(addr, 1, off.Event, off.Replay); err != nil {
		return nil, errors.Join(err, e.close())
	}
	if e.reg, err = enginesim.New(c); err == nil {
		err = e.reg.Start()
	}
	if err != nil {
		e.reg = nil
		return nil, errors.Join(fmt.Errorf("trivial engine %s: %w", addr, err), e.close())
	}
	return e, nil
}

func (e *trivialEngine) complete(w http.ResponseWriter, r *http.Request) {
	b := e.bufs.Get().(*[32 << 10]byte)
	_, err := io.CopyBuffer(io.Discard, r.Body, b[:])
	e.bufs.Put(b)
	if err != nil {
		http.Error(w, "reading the body: "+err.Error(), http.StatusBadRequest)
		return
	}
	h := w.Header()
	if !e.stream {
		h["Content-Type"] = []string{"application/json"}
		h["Content-Length"] = []string{strconv.Itoa(len(e.answer))}
		_, _ = io.WriteString(w, e.answer)
		return
	}
	h["Content-Type"] = []string{"text/event-stream"}
	rc := http.NewResponseController(w)
	for i := 1; i <= e.tokens; i++ {
		event := e.event
		if i == e.tokens {
			event = e.lastEvent
		}
		if _, err := io.WriteString(w, event); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
	}
	_, _ = io.WriteString(w, doneEvent)
}

// announce stores one prompt in the registrar's cache, which publishes
// it: the one KV event an engine sends in a run.
func (e *trivialEngine) announce(tokens []uint32) error {
	if _, _, err := e.reg.Prefill(0, tokens); err != nil {
		return fmt.Errorf("trivial engine %s: announce a block: %w", e.addr, err)
	}
	return nil
}

// close stops the registrar (its etcd key goes at once) and the server.
func (e *trivialEngine) close() error {
	var errs []error
	if e.reg != nil {
		errs = append(errs, e.reg.Close())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.srv.Shutdown(ctx); err != nil {
		errs = append(errs, e.srv.Close())
	}
	<-e.served
	return errors.Join(errs...)
}
