package enginesim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/kvcar/kvcar/internal/baidustd"
)

// HTTP server limits. Writes are allowed long enough for a streamed
// completion; everything else is short because the callers are tests.
const (
	httpReadHeaderTimeout = 5 * time.Second
	httpReadTimeout       = 30 * time.Second
	httpWriteTimeout      = 2 * time.Minute
	httpIdleTimeout       = time.Minute
	httpShutdownTimeout   = 2 * time.Second
)

// httpServer is the engine's business port: HTTP, and baidu_std on the
// same listener told apart by the PRPC magic, as brpc serves both. Its
// goroutines belong to the Engine and end in stop.
type httpServer struct {
	srv     *http.Server
	rpc     *rpcSide
	mux     *baidustd.Mux
	addr    string
	done    chan struct{}
	muxDone chan struct{}
}

// routes builds the engine's whole HTTP surface in one place: /health for
// kvcar's registry and the OpenAI request path (serve.go).
func (e *Engine) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", e.handleHealth)
	mux.HandleFunc("POST /v1/completions", e.handleCompletions)
	mux.HandleFunc("POST /v1/chat/completions", e.handleChatCompletions)
	mux.HandleFunc("GET /v1/models", e.handleModels)
	return mux
}

// handleHealth answers kvcar's registry, which probes it when the
// instance's etcd key disappears to tell a lost lease from a dead engine.
func (e *Engine) handleHealth(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if e.unhealthy.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("unhealthy"))
		return
	}
	_, _ = w.Write([]byte("ok"))
}

// SetHealthy makes /health answer 200 (true, the default) or 503. Like the
// other fault settings it survives Restart.
func (e *Engine) SetHealthy(ok bool) { e.unhealthy.Store(!ok) }

// HTTPAddr returns the business HTTP address, with the real port once the
// engine has started; it is empty when the engine serves no HTTP.
func (e *Engine) HTTPAddr() string {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.httpAddr
}

// startHTTP binds addr, retrying until deadline when the address was held
// by this engine a moment ago, and starts serving.
func (e *Engine) startHTTP(addr string, deadline time.Time) (*httpServer, error) {
	var ln net.Listener
	for {
		var err error
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("enginesim: %s: http listen: %w", e.cfg.Name, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	rpc, err := e.newRPCSide()
	if err != nil {
		ln.Close()
		return nil, err
	}
	h := &httpServer{
		rpc: rpc,
		mux: baidustd.NewMux(ln, rpc.srv, httpReadHeaderTimeout),
		srv: &http.Server{
			Handler:           e.routes(),
			ReadHeaderTimeout: httpReadHeaderTimeout,
			ReadTimeout:       httpReadTimeout,
			WriteTimeout:      httpWriteTimeout,
			IdleTimeout:       httpIdleTimeout,
			ErrorLog:          slog.NewLogLogger(e.cfg.Logger.Handler(), slog.LevelWarn),
		},
		addr:    ln.Addr().String(),
		done:    make(chan struct{}),
		muxDone: make(chan struct{}),
	}
	go func() {
		defer close(h.muxDone)
		if err := h.mux.Serve(); !errors.Is(err, net.ErrClosed) {
			e.cfg.Logger.Warn("business port stopped accepting", "addr", h.addr, "err", err)
		}
	}()
	go func() {
		defer close(h.done)
		if err := h.srv.Serve(h.mux.Listener()); !errors.Is(err, http.ErrServerClosed) {
			e.cfg.Logger.Warn("http server stopped", "addr", h.addr, "err", err)
		}
	}()
	return h, nil
}

// stop shuts the server down, giving open requests a moment, and waits for
// its goroutine.
func (h *httpServer) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), httpShutdownTimeout)
	defer cancel()
	err := h.srv.Shutdown(ctx)
	if err != nil {
		err = errors.Join(err, h.srv.Close())
	}
	<-h.done
	if rerr := h.rpc.stop(ctx); rerr != nil {
		err = errors.Join(err, rerr)
	}
	h.mux.Close()
	<-h.muxDone
	if err != nil {
		return fmt.Errorf("http shutdown %s: %w", h.addr, err)
	}
	return nil
}
