package baidustd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kvcar/kvcar/internal/baidustd/metapb"
	"github.com/kvcar/kvcar/internal/budget"
	"github.com/kvcar/kvcar/internal/sockio"
)

// Server defaults. brpc itself has no handler timeout and reaps no idle
// connection by default; a service on a shared network wants both.
const (
	DefaultHandlerTimeout   = 30 * time.Second
	DefaultIdleTimeout      = 5 * time.Minute
	DefaultFrameReadTimeout = 30 * time.Second
	DefaultWriteTimeout     = 10 * time.Second
	DefaultMaxConns         = 4096
	DefaultMaxCallsPerConn  = 1024
	// DefaultMaxInflightBytes is the default of MaxInflightBytes: two
	// frames of the largest body brpc takes by default.
	DefaultMaxInflightBytes = 2 * DefaultMaxBodySize
)

// workerIdle is how long a connection's worker goroutine waits for its
// next call before it exits. A goroutine started for every call grows
// its stack from the minimum on every call (a handler that decodes a
// protobuf message copies it three or four times); a worker kept between
// calls grows it once.
const workerIdle = time.Second

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = errors.New("baidu_std: server closed")

// Request is one call as a handler sees it. Message and Attachment count
// against the server's MaxInflightBytes until the handler returns: a
// handler that keeps them longer keeps a copy.
type Request struct {
	Service    string
	Method     string
	LogID      int64 // 0 when the call has none
	RequestID  string
	Message    []byte // the serialized request, decompressed
	Attachment []byte
	RemoteAddr net.Addr

	// budget is the server's in-flight budget; held is what the handler
	// took of it (hold), given back when the handler returns.
	budget *budget.Bytes
	held   int64
	// compress is the call's compress type and wireSize its payload's
	// size as sent, which brpc's parse errors name.
	compress int32
	wireSize int
}

// hold takes n more bytes of the in-flight budget for the rest of the
// call, and reports whether they fitted.
func (r *Request) hold(n int64) bool {
	if !r.budget.Take(n) {
		return false
	}
	r.held += n
	return true
}

// Response is a handler's successful answer.
type Response struct {
	Message    []byte // the serialized response
	Attachment []byte
}

// Handler serves one method. Its context ends when the call's timeout
// passes or the server is closed. An *Error chooses the error_code;
// any other error is sent as brpc sends a handler's SetFailed(reason):
// EINTERNAL with the reason.
type Handler func(ctx context.Context, req *Request) (Response, error)

// ServerOptions configures a Server. Zero values select the defaults.
type ServerOptions struct {
	// Identity is the "ip:port" that prefixes every error_text, as brpc
	// prefixes its server's address; empty: the address of the listener
	// the call came on.
	Identity string
	// MaxBodySize bounds a frame's body_size (DefaultMaxBodySize).
	MaxBodySize uint32
	// HandlerTimeout bounds a call, unless the request's own timeout_ms
	// is shorter (DefaultHandlerTimeout). A call past it is answered
	// with ERPCTIMEDOUT; its handler's context ends.
	HandlerTimeout time.Duration
	// IdleTimeout: a connection with no call in flight that brings
	// nothing for this long is closed (DefaultIdleTimeout).
	IdleTimeout time.Duration
	// FrameReadTimeout bounds the arrival of the rest of a frame once it
	// has begun (DefaultFrameReadTimeout).
	FrameReadTimeout time.Duration
	// WriteTimeout bounds writing one response (DefaultWriteTimeout).
	WriteTimeout time.Duration
	// MaxConns bounds the open connections; one more is closed at once
	// (DefaultMaxConns).
	MaxConns int
	// MaxCallsPerConn bounds the calls in flight on one connection; past
	// it the connection is not read until one finishes
	// (DefaultMaxCallsPerConn).
	MaxCallsPerConn int
	// MaxInflightBytes bounds the bytes all calls hold at once: their
	// frames, taken as they arrive, what their metas may decode to, their
	// decompressed messages, what a Unary handler's message may decode
	// to, and callCost each, until their handlers return
	// (DefaultMaxInflightBytes; at least MaxBodySize). A call that does
	// not fit is answered ELIMIT (a frame refused is read to its end and
	// dropped), which brpc's default retry policy retries; its
	// connection serves on.
	MaxInflightBytes int64
	// Logger receives connection problems; nil discards them.
	Logger *slog.Logger
}

func (o *ServerOptions) setDefaults() {
	if o.MaxBodySize == 0 {
		o.MaxBodySize = DefaultMaxBodySize
	}
	if o.HandlerTimeout <= 0 {
		o.HandlerTimeout = DefaultHandlerTimeout
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.FrameReadTimeout <= 0 {
		o.FrameReadTimeout = DefaultFrameReadTimeout
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	if o.MaxConns <= 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.MaxCallsPerConn <= 0 {
		o.MaxCallsPerConn = DefaultMaxCallsPerConn
	}
	if o.MaxInflightBytes <= 0 {
		o.MaxInflightBytes = DefaultMaxInflightBytes
	}
	// A frame at the limit must fit, or it could never be served.
	o.MaxInflightBytes = max(o.MaxInflightBytes, int64(o.MaxBodySize))
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Server serves registered methods over baidu_std. Register every method
// before the first Serve.
type Server struct {
	opts ServerOptions
	log  *slog.Logger
	// inflight is what the calls hold (MaxInflightBytes).
	inflight *budget.Bytes
	// refused counts the calls answered ELIMIT; lastRefusalLog is when
	// one was last logged (Unix nanoseconds), at most once a minute, so a
	// peer cannot flood the log.
	refused        atomic.Int64
	lastRefusalLog atomic.Int64

	// services maps a full service name to its methods; short maps a
	// service name without its package to the full one, for clients
	// that send short names (brpc accepts them for jprotobuf).
	services map[string]map[string]Handler
	short    map[string]string

	base   context.Context // parent of every handler's context
	cancel context.CancelFunc

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*serverConn]struct{}
	closing   bool
	wg        sync.WaitGroup // every connection goroutine
}

// NewServer makes a server; Register methods, then Serve.
func NewServer(opts ServerOptions) *Server {
	opts.setDefaults()
	base, cancel := context.WithCancel(context.Background())
	return &Server{
		opts:      opts,
		log:       opts.Logger,
		inflight:  budget.New(opts.MaxInflightBytes),
		services:  make(map[string]map[string]Handler),
		short:     make(map[string]string),
		base:      base,
		cancel:    cancel,
		listeners: make(map[net.Listener]struct{}),
		conns:     make(map[*serverConn]struct{}),
	}
}

// Register adds a method under the full protobuf service name, e.g.
// "xllm_service.proto.XllmRpcService" and "Heartbeat".
func (s *Server) Register(service, method string, h Handler) error {
	if service == "" || method == "" || h == nil {
		return errors.New("baidu_std: Register needs a service, a method and a handler")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.services[service]
	if m == nil {
		m = make(map[string]Handler)
		s.services[service] = m
		short := service[strings.LastIndexByte(service, '.')+1:]
		s.short[short] = service
	}
	if _, dup := m[method]; dup {
		return fmt.Errorf("baidu_std: %s/%s registered twice", service, method)
	}
	m[method] = h
	return nil
}

// Serve accepts connections on ln until Shutdown or Close, and returns
// ErrServerClosed then; any other accept error is returned at once. The
// server closes ln.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
		ln.Close()
	}()
	for {
		c, err := sockio.Accept(ln, s.base.Done(), s.log)
		if err != nil {
			if s.isClosing() {
				return ErrServerClosed
			}
			return fmt.Errorf("baidu_std: accept: %w", err)
		}
		s.ServeConn(c)
	}
}

// ServeConn serves one connection that was accepted elsewhere, e.g. by a
// listener shared with HTTP; it returns at once. The server owns c.
func (s *Server) ServeConn(c net.Conn) {
	s.serveConn(c, bufio.NewReader(c))
}

func (s *Server) serveConn(c net.Conn, r *bufio.Reader) {
	identity := s.opts.Identity
	if identity == "" {
		identity = c.LocalAddr().String()
	}
	sc := &serverConn{s: s, c: c, r: r, identity: identity, sem: make(chan struct{}, s.opts.MaxCallsPerConn), work: make(chan inbound)}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		c.Close()
		return
	}
	if len(s.conns) >= s.opts.MaxConns {
		s.mu.Unlock()
		s.log.Warn("baidu_std connection refused: too many connections", "remote", c.RemoteAddr(), "max_conns", s.opts.MaxConns)
		c.Close()
		return
	}
	s.conns[sc] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	go sc.serve()
}

func (s *Server) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

// Shutdown stops accepting, stops reading new calls, lets the calls in
// flight finish and their responses go out, then closes every
// connection. When ctx ends first, it closes everything at once, ends the
// handlers' contexts and returns ctx's error after the connections'
// goroutines have stopped.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	for ln := range s.listeners {
		ln.Close()
	}
	for sc := range s.conns {
		sc.stopReading()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		s.cancel()
		return nil
	case <-ctx.Done():
	}
	s.forceClose()
	<-done
	return ctx.Err()
}

// Close closes every listener and connection at once and waits for the
// connections' goroutines; handlers still running see their context end.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closing = true
	for ln := range s.listeners {
		ln.Close()
	}
	s.mu.Unlock()
	s.forceClose()
	s.wg.Wait()
	return nil
}

func (s *Server) forceClose() {
	// The connections close before the handlers' contexts end, so that a
	// handler answering its cancellation cannot get that answer out.
	s.mu.Lock()
	for sc := range s.conns {
		sc.c.Close()
	}
	s.mu.Unlock()
	s.cancel()
}

// serverConn is one connection. Its goroutine reads frames and hands each
// call to an idle worker, or starts one; it waits for the calls and then
// the workers before it closes the connection.
type serverConn struct {
	s        *Server
	c        net.Conn
	r        *bufio.Reader
	identity string
	sem      chan struct{} // one token per call in flight
	calls    sync.WaitGroup
	work     chan inbound // a call for an idle worker; closed when serve ends
	workers  sync.WaitGroup
	active   atomic.Int32
	stopping atomic.Bool

	wmu    sync.Mutex
	broken bool // a write failed: nothing more is written
}

func (sc *serverConn) stopReading() {
	sc.stopping.Store(true)
	_ = sc.c.SetReadDeadline(time.Now())
}

func (sc *serverConn) serve() {
	s := sc.s
	defer func() {
		sc.calls.Wait()
		close(sc.work)
		sc.workers.Wait()
		sc.c.Close()
		s.mu.Lock()
		delete(s.conns, sc)
		s.mu.Unlock()
		s.wg.Done()
	}()
	for {
		if reason := sc.waitFrame(); reason != "" {
			if reason != "eof" && reason != "stopping" {
				s.log.Info("baidu_std connection closed", "remote", sc.c.RemoteAddr(), "reason", reason)
			}
			return
		}
		_ = sc.c.SetReadDeadline(time.Now().Add(s.opts.FrameReadTimeout))
		f, held, err := readFrame(sc.r, s.opts.MaxBodySize, s.inflight)
		var over *overBudget
		if errors.As(err, &over) {
			sc.refuse(over)
			continue
		}
		if err != nil {
			if !sc.stopping.Load() {
				s.log.Warn("baidu_std connection closed: cannot read a frame", "remote", sc.c.RemoteAddr(), "err", err)
			}
			return
		}
		// A call also costs its goroutine, stack, timer and context, some
		// 6 KiB: charged too, so that the budget bounds the calls at work
		// however small their frames.
		if !s.inflight.Take(callCost) {
			s.inflight.Give(held)
			sc.refuseCall(f.Meta.GetCorrelationId(), extended(f.Meta),
				fmt.Sprintf("a call of %d bytes and its %d of work do not fit in %d", held, callCost, s.inflight.Max()))
			continue
		}
		held += callCost
		// Past MaxCallsPerConn this waits for a call to finish before
		// reading on: the peer's writes back up, not this process.
		sc.sem <- struct{}{}
		sc.active.Add(1)
		sc.calls.Add(1)
		in := inbound{f: f, held: held}
		select {
		case sc.work <- in:
		default:
			sc.workers.Add(1)
			go sc.worker(in)
		}
	}
}

// callCost is what the in-flight budget charges a call besides its
// frame: 4,096 calls parked in handlers held about 6,000 bytes each of
// heap and stack, against some 600 their frames and metas were charged.
const callCost = 8 << 10

// inbound is a call read off the connection and what its frame holds of
// the in-flight budget.
type inbound struct {
	f    Frame
	held int64
}

// refuse answers the call of a frame the in-flight budget could not
// hold. It runs on the reading goroutine, as brpc answers a call it
// cannot take before any handler runs.
func (sc *serverConn) refuse(over *overBudget) {
	sc.refuseCall(over.meta.GetCorrelationId(), extended(over.meta),
		fmt.Sprintf("a frame of %d bytes does not fit in %d", over.body, sc.s.inflight.Max()))
}

// limitReached begins the text of every call refused for the in-flight
// budget.
const limitReached = "Reached server's limit on request bytes in flight"

// refuseCall answers call cid ELIMIT, saying what did not fit.
func (sc *serverConn) refuseCall(cid int64, ext bool, what string) {
	sc.noteRefusal()
	sc.respondError(cid, ext, ELIMIT, true, limitReached+": "+what+"; retry later")
}

// noteRefusal counts a call answered ELIMIT and logs it, with the count
// so far, unless another was logged within the minute.
func (sc *serverConn) noteRefusal() {
	s := sc.s
	n := s.refused.Add(1)
	now := time.Now().UnixNano()
	if last := s.lastRefusalLog.Load(); now-last >= int64(time.Minute) && s.lastRefusalLog.CompareAndSwap(last, now) {
		s.log.Warn("baidu_std call refused: requests in flight at the limit", "remote", sc.c.RemoteAddr(),
			"max_inflight_bytes", s.inflight.Max(), "refused_total", n)
	}
}

// worker runs call in, then the calls serve hands it, until it has
// waited workerIdle for one or serve has ended.
func (sc *serverConn) worker(in inbound) {
	defer sc.workers.Done()
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		sc.call(in)
		idle.Reset(workerIdle)
		var ok bool
		select {
		case in, ok = <-sc.work:
			if !ok {
				return
			}
		case <-idle.C:
			return
		}
	}
}

// waitFrame waits for the first byte of the next frame, closing idle
// connections. It returns "" when a frame is starting, else why the
// connection ends.
func (sc *serverConn) waitFrame() string {
	s := sc.s
	for {
		if sc.stopping.Load() {
			return "stopping"
		}
		if sc.r.Buffered() > 0 {
			return ""
		}
		_ = sc.c.SetReadDeadline(time.Now().Add(s.opts.IdleTimeout))
		if sc.stopping.Load() {
			return "stopping" // stopReading's deadline may have been overwritten
		}
		_, err := sc.r.Peek(1)
		if err == nil {
			return ""
		}
		if sc.stopping.Load() {
			return "stopping"
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			if sc.active.Load() > 0 {
				continue // calls in flight: not idle
			}
			return fmt.Sprintf("idle for %v", s.opts.IdleTimeout)
		}
		if errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) {
			return "eof"
		}
		return err.Error()
	}
}

func (sc *serverConn) call(in inbound) {
	s := sc.s
	held := in.held
	defer func() {
		s.inflight.Give(held)
		sc.active.Add(-1)
		<-sc.sem
		sc.calls.Done()
	}()
	// The call's bytes go back to the budget before its answer is
	// written, not after: a peer that does not read its answers blocks
	// that write for up to WriteTimeout, and must not hold the budget
	// every other connection's calls need meanwhile.
	release := func() {
		s.inflight.Give(held)
		held = 0
	}
	f := in.f
	meta := f.Meta
	cid := meta.GetCorrelationId()
	ext := extended(meta)
	h, code, text := s.lookup(meta.GetRequest())
	if h == nil {
		release()
		sc.respondError(cid, ext, code, true, text)
		return
	}
	msg, att, ok := f.Parts()
	if !ok {
		release()
		what := "larger than"
		if meta.GetAttachmentSize() < 0 {
			what = "negative; the"
		}
		sc.respondError(cid, ext, EREQUEST, true, fmt.Sprintf("attachment_size=%d is %s request_size=%d",
			meta.GetAttachmentSize(), what, len(f.Payload)))
		return
	}
	if ct, cs := meta.GetContentType(), meta.GetChecksumType(); ct != 0 || cs != 0 {
		release()
		sc.respondError(cid, ext, EREQUEST, true, fmt.Sprintf("content_type=%d and checksum_type=%d are not supported; only 0 is", ct, cs))
		return
	}
	ctype := meta.GetCompressType()
	if ctype != CompressNone {
		out, n, err := decompress(ctype, msg, int(s.opts.MaxBodySize), s.inflight)
		switch {
		case errors.Is(err, errBudget):
			release()
			sc.refuseCall(cid, ext, fmt.Sprintf("request_size=%d decompressed (CompressType=%s) does not fit in %d",
				len(f.Payload), compressName(ctype), s.inflight.Max()))
			return
		case err != nil:
			release()
			sc.respondError(cid, ext, EREQUEST, true, fmt.Sprintf("Fail to parse request message, CompressType=%s, request_size=%d",
				compressName(ctype), len(f.Payload)))
			return
		}
		msg, held = out, held+n
	}
	rm := meta.GetRequest()
	req := &Request{
		Service: rm.GetServiceName(), Method: rm.GetMethodName(), LogID: rm.GetLogId(), RequestID: rm.GetRequestId(),
		Message: msg, Attachment: att, RemoteAddr: sc.c.RemoteAddr(), budget: s.inflight,
		compress: ctype, wireSize: len(f.Payload),
	}
	timeout := s.opts.HandlerTimeout
	if t := rm.GetTimeoutMs(); t > 0 {
		timeout = min(timeout, time.Duration(t)*time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(s.base, timeout)
	defer cancel()

	// Exactly one response: the handler's, or the timeout's when the
	// handler is late. The late handler runs on, its context ended.
	var answered atomic.Bool
	fired := make(chan struct{})
	t := time.AfterFunc(timeout, func() {
		defer close(fired)
		if answered.CompareAndSwap(false, true) {
			sc.respondError(cid, ext, ERPCTIMEDOUT, true, fmt.Sprintf("%s/%s did not finish within %v", req.Service, req.Method, timeout))
		}
	})
	resp, err := sc.run(ctx, h, req)
	// The call waited for its handler, even past its timeout: what the
	// handler took is given back with the frame.
	held += req.held
	release()
	if !t.Stop() {
		<-fired
	}
	if !answered.CompareAndSwap(false, true) {
		return
	}
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			if e.Code == ELIMIT {
				sc.noteRefusal()
			}
			sc.respondError(cid, ext, e.Code, true, e.Text)
		} else {
			sc.respondError(cid, ext, EINTERNAL, false, err.Error())
		}
		return
	}
	sc.respond(responseMeta(cid, 0, "", ext), resp.Message, resp.Attachment)
}

// run calls h, turning a panic into an error so that one bad call does
// not take the process down.
func (sc *serverConn) run(ctx context.Context, h Handler, req *Request) (resp Response, err error) {
	defer func() {
		if p := recover(); p != nil {
			sc.s.log.Error("baidu_std handler panicked", "service", req.Service, "method", req.Method, "panic", p,
				"stack", string(debug.Stack()))
			err = Errorf(EINTERNAL, "%s/%s panicked: %v", req.Service, req.Method, p)
		}
	}()
	return h(ctx, req)
}

// lookup finds the handler of a call, or the error brpc answers: a short
// service name that no service has is ENOSERVICE, any other miss
// ENOMETHOD.
func (s *Server) lookup(rm *metapb.RpcRequestMeta) (Handler, Errno, string) {
	svc, method := rm.GetServiceName(), rm.GetMethodName()
	full := svc
	if !strings.Contains(svc, ".") {
		var ok bool
		if full, ok = s.short[svc]; !ok {
			return nil, ENOSERVICE, "Fail to find service=" + svc
		}
	}
	if h := s.services[full][method]; h != nil {
		return h, 0, ""
	}
	return nil, ENOMETHOD, "Fail to find method=" + svc + "/" + method
}

func (sc *serverConn) respondError(cid int64, ext bool, code Errno, coded bool, text string) {
	sc.respond(responseMeta(cid, code, errorText(sc.identity, code, coded, text), ext), nil, nil)
}

var framePool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// respond writes one response frame. A failed write closes the
// connection: the peer cannot tell which of its calls were answered.
func (sc *serverConn) respond(meta *metapb.RpcMeta, msg, att []byte) {
	bp := framePool.Get().(*[]byte)
	defer func() {
		if cap(*bp) <= 64<<10 {
			framePool.Put(bp)
		}
	}()
	b, err := AppendFrame((*bp)[:0], meta, msg, att)
	*bp = b
	if err != nil {
		// Too large to frame: answer with the error instead.
		b, _ = AppendFrame((*bp)[:0], responseMeta(meta.GetCorrelationId(), ERESPONSE,
			errorText(sc.identity, ERESPONSE, true, err.Error()), extended(meta)), nil, nil)
		*bp = b
	}
	sc.wmu.Lock()
	defer sc.wmu.Unlock()
	if sc.broken {
		return
	}
	_ = sc.c.SetWriteDeadline(time.Now().Add(sc.s.opts.WriteTimeout))
	if _, err := sc.c.Write(b); err != nil {
		sc.broken = true
		if !sc.s.isClosing() {
			sc.s.log.Warn("baidu_std connection closed: cannot write a response", "remote", sc.c.RemoteAddr(), "err", err)
		}
		sc.c.Close()
	}
}

// Unary adapts a typed function to a Handler: the request message is
// decoded into a new Req (EREQUEST when it does not parse, worded as
// brpc words it) and the response encoded. What the decode can allocate
// is taken from the server's in-flight budget first (see decodeCost): a
// message that would decode past it is answered ELIMIT undecoded.
func Unary[Req any, PReq interface {
	*Req
	proto.Message
}, Resp proto.Message](fn func(ctx context.Context, req PReq) (Resp, error)) Handler {
	costs := newDecodeCost(PReq(new(Req)).ProtoReflect().Descriptor())
	return func(ctx context.Context, r *Request) (Response, error) {
		req := PReq(new(Req))
		if n := costs.of(r.Message); !r.hold(n) {
			return Response{}, Errorf(ELIMIT, "%s: request_size=%d may decode to %d bytes, which do not fit; retry later",
				limitReached, len(r.Message), n)
		}
		if err := proto.Unmarshal(r.Message, req); err != nil {
			size := len(r.Message) + len(r.Attachment)
			if r.compress != CompressNone {
				size = r.wireSize
			}
			return Response{}, Errorf(EREQUEST, "Fail to parse request message, CompressType=%s, request_size=%d",
				compressName(r.compress), size)
		}
		resp, err := fn(ctx, req)
		if err != nil {
			return Response{}, err
		}
		b, err := proto.Marshal(resp)
		if err != nil {
			return Response{}, Errorf(ERESPONSE, "Fail to serialize response, CompressType=none")
		}
		return Response{Message: b}, nil
	}
}
