package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/kvcar/kvcar/internal/sockio"
)

// HTTP1Server serves an http.Handler over HTTP/1.0 and 1.1 with one
// goroutine per connection and nothing else per request: no background
// read of the connection, no deadline set per request, the response's
// head written with its body in one write. It is what kvcar's public
// listener runs: at one client net/http's server spent more CPU around
// the handler (its watching goroutine, deadline timers, wake-ups) than
// the handler itself.
//
// Its timeouts are kept by one watcher goroutine per server, which looks
// at every connection each watchTick: a connection idle past IdleTimeout
// is closed, one whose head takes longer than ReadHeaderTimeout or whose
// head and body take longer than ReadTimeout has its reads ended, and
// one whose request is being served (its body read) is peeked without
// blocking, so that a client that closed its connection has the
// request's context cancelled, which ends the engine request. Timeouts
// thus fire up to one tick late and a gone client is seen within a tick.
//
// Requests are served in order on each connection (pipelined ones too,
// one after the other). The request context is the connection's: it ends
// when the client goes away or the server is closed. Trailers in
// responses, protocol upgrades, Hijack and HTTP/2 are not supported:
// kvcar's public routes use none of them.
type HTTP1Server struct {
	handler http.Handler
	opts    HTTP1Options
	log     *slog.Logger

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*h1conn]struct{}
	watching  bool
	// closing is set by Shutdown and Close: no new connections, and
	// every connection closes after its current request.
	closing atomic.Bool
	stop    chan struct{}
	stopped sync.Once

	// outBufs are response bodies being buffered, and inBufs what the
	// connections read into, shared by the connections so that an idle
	// one holds neither.
	outBufs, inBufs sync.Pool
	date            atomic.Pointer[dateLine]
}

// HTTP1Options configures an HTTP1Server; a zero field takes its default.
type HTTP1Options struct {
	// ReadHeaderTimeout bounds reading a request's head from its first
	// byte; default 10 s.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a request's head and body together;
	// default 60 s.
	ReadTimeout time.Duration
	// IdleTimeout closes a kept-alive connection with no request for
	// that long; default 120 s.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's head (request line and header
	// fields), and a chunked body's trailer; default 1 MiB, net/http's.
	MaxHeaderBytes int
	// Logger receives handler panics; nil discards.
	Logger *slog.Logger
}

// Defaults of HTTP1Options.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 60 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultMaxHeaderBytes    = 1 << 20
)

// watchTick is how often the watcher looks at the connections.
const watchTick = 200 * time.Millisecond

// maxDiscardBody is the most of a body the handler left unread that is
// read and dropped to keep the connection; past it the connection is
// closed (net/http's bound).
const maxDiscardBody = 256 << 10

// outBufSize is what a response body is buffered up to before it is
// written; an answer that fits goes out with its head in one write.
const outBufSize = 32 << 10

// readBufSize is each connection's read buffer, net/http's size.
const readBufSize = 4 << 10

// inBufSize is how much one read of a client's socket takes at most:
// the head and body of a request with a prompt of some 8,000 ids.
const inBufSize = 64 << 10

// spillReader is what a connection's bufio.Reader reads from. Each read
// of the socket goes into a buffer of inBufSize taken from the server's
// pool for that read, given back before a wait, so a request whose head
// and body arrived together is read in one system call while an idle
// connection holds only its bufio.Reader's readBufSize. What the
// bufio.Reader's read has no room for is kept for the reads after it
// (the body's), and the buffer goes back once they have taken all of it.
// A read with room of its own for more than readBufSize, once nothing
// is kept, goes to the socket directly.
type spillReader struct {
	io    *sockio.Conn
	pool  *sync.Pool
	taken *[]byte
	spill []byte
}

func newSpillReader(io *sockio.Conn, pool *sync.Pool) *spillReader {
	r := &spillReader{io: io, pool: pool}
	io.SetTake(r.take, r.giveBack)
	return r
}

func (r *spillReader) take() []byte {
	r.taken = r.pool.Get().(*[]byte)
	return *r.taken
}

func (r *spillReader) giveBack() {
	r.pool.Put(r.taken)
	r.taken = nil
}

func (r *spillReader) Read(p []byte) (int, error) {
	if len(r.spill) == 0 {
		// The bufio.Reader fills its buffer with reads of readBufSize
		// at most; only a read of a body past it has more room.
		if len(p) > readBufSize {
			return r.io.Read(p)
		}
		buf, n, err := r.io.ReadTaken()
		if n == 0 {
			return 0, err
		}
		r.spill = buf[:n]
	}
	n := copy(p, r.spill)
	r.spill = r.spill[n:]
	if len(r.spill) == 0 {
		r.spill = nil
		r.giveBack()
	}
	return n, nil
}

// buffered is how many bytes it has read and kept.
func (r *spillReader) buffered() int { return len(r.spill) }

// NewHTTP1Server returns a server of h.
func NewHTTP1Server(h http.Handler, o HTTP1Options) *HTTP1Server {
	if o.ReadHeaderTimeout <= 0 {
		o.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if o.ReadTimeout <= 0 {
		o.ReadTimeout = DefaultReadTimeout
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.MaxHeaderBytes <= 0 {
		o.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	s := &HTTP1Server{handler: h, opts: o, log: o.Logger, listeners: map[net.Listener]struct{}{},
		conns: map[*h1conn]struct{}{}, stop: make(chan struct{})}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.outBufs.New = func() any { b := make([]byte, 0, outBufSize); return &b }
	s.inBufs.New = func() any { b := make([]byte, inBufSize); return &b }
	return s
}

// Serve accepts connections on ln until Shutdown or Close, then returns
// http.ErrServerClosed; another error of ln ends it too. ln is closed
// when Serve returns.
func (s *HTTP1Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing.Load() {
		s.mu.Unlock()
		ln.Close()
		return http.ErrServerClosed
	}
	s.listeners[ln] = struct{}{}
	if !s.watching {
		s.watching = true
		go s.watch()
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
		ln.Close()
	}()
	for {
		conn, err := sockio.Accept(ln, s.stop, s.log)
		if err != nil {
			if s.closing.Load() {
				return http.ErrServerClosed
			}
			return fmt.Errorf("accepting: %w", err)
		}
		c := s.newConn(conn)
		s.mu.Lock()
		if s.closing.Load() {
			s.mu.Unlock()
			conn.Close()
			return http.ErrServerClosed
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		go c.serve()
	}
}

// Shutdown stops accepting, closes idle connections and waits for the
// others to finish their current request (each then closes, its answer
// saying so) or for ctx to end, whose error it then returns.
func (s *HTTP1Server) Shutdown(ctx context.Context) error {
	s.beginClose()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		s.mu.Lock()
		n := len(s.conns)
		for c := range s.conns {
			c.closeIfIdle()
		}
		s.mu.Unlock()
		if n == 0 {
			s.stopWatch()
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Close stops accepting and closes every connection at once, which
// cancels the requests being served.
func (s *HTTP1Server) Close() error {
	s.beginClose()
	s.mu.Lock()
	for c := range s.conns {
		c.abort()
	}
	s.mu.Unlock()
	s.stopWatch()
	return nil
}

func (s *HTTP1Server) beginClose() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closing.Store(true)
	for ln := range s.listeners {
		ln.Close()
	}
}

func (s *HTTP1Server) stopWatch() { s.stopped.Do(func() { close(s.stop) }) }

// watch keeps the timeouts and watches served requests' clients until
// the server stops.
func (s *HTTP1Server) watch() {
	t := time.NewTicker(watchTick)
	defer t.Stop()
	var conns []*h1conn
	for {
		select {
		case <-s.stop:
			return
		case now := <-t.C:
			s.mu.Lock()
			conns = conns[:0]
			for c := range s.conns {
				conns = append(conns, c)
			}
			s.mu.Unlock()
			for _, c := range conns {
				c.check(now.UnixNano())
			}
			clear(conns)
		}
	}
}

// Connection states, the watcher's view of what a connection waits for.
const (
	connIdle int32 = iota // the next request's first byte
	connHead              // the rest of a head
	connBody              // the handler runs, the body not read to its end
	connWork              // the handler runs, the body read
	connClosed
)

// h1conn is one client connection and everything reused across its
// requests.
type h1conn struct {
	srv    *HTTP1Server
	conn   net.Conn
	io     *sockio.Conn
	raw    syscall.RawConn
	br     *bufio.Reader
	in     *spillReader
	hr     headReader
	head   reqHead
	remote string
	ctx    context.Context
	cancel context.CancelFunc

	state atomic.Int32
	// since is when the state began (Unix ns): the request's first byte
	// for connHead and connBody.
	since atomic.Int64
	// expired is set once the watcher ended the connection's reads.
	expired atomic.Bool

	// req is reset from base, which holds only the context, for every
	// request; url is the request's URL, copied from lastURL when the
	// target repeats.
	base, req http.Request
	url       url.URL
	lastURL   *url.URL
	urlTarget string
	w         h1writer
	body      h1body
}

func (s *HTTP1Server) newConn(conn net.Conn) *h1conn {
	c := &h1conn{srv: s, conn: conn, io: sockio.New(conn), remote: conn.RemoteAddr().String()}
	c.in = newSpillReader(c.io, &s.inBufs)
	c.br = bufio.NewReaderSize(c.in, readBufSize)
	c.raw = c.io.Raw()
	c.hr = headReader{br: c.br, maxBytes: s.opts.MaxHeaderBytes}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.base = *(&http.Request{}).WithContext(c.ctx)
	c.w.c, c.body.c = c, c
	c.since.Store(time.Now().UnixNano())
	return c
}

// setState moves c to st unless it was closed meanwhile.
func (c *h1conn) setState(st int32) bool {
	for {
		cur := c.state.Load()
		if cur == connClosed {
			return false
		}
		if c.state.CompareAndSwap(cur, st) {
			return true
		}
	}
}

// check is the watcher's look at c.
func (c *h1conn) check(now int64) {
	s := c.srv
	elapsed := time.Duration(now - c.since.Load())
	switch c.state.Load() {
	case connIdle:
		if elapsed > s.opts.IdleTimeout || s.closing.Load() {
			c.closeIfIdle()
		}
	case connHead:
		if elapsed > s.opts.ReadHeaderTimeout || elapsed > s.opts.ReadTimeout {
			c.expire()
		}
	case connBody:
		if elapsed > s.opts.ReadTimeout {
			c.expire()
		}
	case connWork:
		if c.clientGone() {
			c.cancel()
		}
	}
}

// expire ends c's reads: the one waiting fails, and so does every later
// one.
func (c *h1conn) expire() {
	if !c.expired.Swap(true) {
		_ = c.conn.SetReadDeadline(time.Unix(1, 0))
	}
}

// closeIfIdle closes c when it waits for a request and has none.
func (c *h1conn) closeIfIdle() {
	if c.state.CompareAndSwap(connIdle, connClosed) {
		c.conn.Close()
	}
}

// abort closes c whatever it is doing and cancels its request.
func (c *h1conn) abort() {
	c.state.Store(connClosed)
	c.cancel()
	c.conn.Close()
}

// clientGone reports whether the client has closed its side or reset the
// connection: a peek that neither blocks nor takes the connection's read
// lock (the watcher must never wait on a connection).
func (c *h1conn) clientGone() bool {
	if c.raw == nil {
		return false
	}
	gone := false
	_ = c.raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1,
			syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
		gone = (e == 0 && n == 0) || (e != 0 && e != syscall.EAGAIN && e != syscall.EWOULDBLOCK && e != syscall.EINTR)
	})
	return gone
}

// serve serves c's requests until it closes.
func (c *h1conn) serve() {
	defer func() {
		c.state.Store(connClosed)
		c.cancel()
		c.conn.Close()
		c.srv.mu.Lock()
		delete(c.srv.conns, c)
		c.srv.mu.Unlock()
	}()
	for c.next() {
		err := c.hr.read(&c.head)
		if err != nil {
			var he *headError
			if errors.As(err, &he) {
				c.refuse(he)
				c.linger()
			}
			return
		}
		if !c.serveRequest() {
			if !c.body.done && c.w.err == nil {
				c.linger()
			}
			return
		}
	}
}

// lingerTime is how long a connection closing with request bytes unread
// waits for the client to stop sending.
const lingerTime = 500 * time.Millisecond

// linger ends c's side after an answer sent while the client may still be
// sending (an oversize body refused, a malformed head), for up to
// lingerTime: closed with unread bytes, the connection would be reset,
// and the reset can reach the client's writer before its reader has the
// answer. It drains up to maxDiscardBody, so that a short remainder ends
// cleanly; past that it stops reading and only waits, so that a client
// sending megabytes is held by flow control (not reset) while it reads
// the answer, at no CPU cost here.
func (c *h1conn) linger() {
	cw, ok := c.conn.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil {
		return
	}
	c.state.Store(connClosed)
	deadline := time.Now().Add(lingerTime)
	_ = c.conn.SetReadDeadline(deadline)
	if n, _ := io.CopyN(io.Discard, c.conn, maxDiscardBody); n < maxDiscardBody {
		return // the client closed, or the time is up
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-t.C:
	case <-c.srv.stop:
	}
}

// next waits for the next request's first byte and reports whether to
// read it.
func (c *h1conn) next() bool {
	if c.br.Buffered() == 0 && c.in.buffered() == 0 {
		c.since.Store(time.Now().UnixNano())
		if !c.setState(connIdle) || c.srv.closing.Load() {
			return false
		}
		if _, err := c.br.Peek(1); err != nil {
			return false
		}
	}
	c.since.Store(time.Now().UnixNano())
	return c.setState(connHead)
}

// refuse answers a head kvcar will not serve, and the connection closes.
func (c *h1conn) refuse(he *headError) {
	c.w.reset(&reqHead{method: http.MethodGet, minor: 1, close: true})
	writeError(&c.w, he.status, he.message)
	c.w.finish()
}

// serveRequest runs the handler on the head just read and reports
// whether the connection takes another request.
func (c *h1conn) serveRequest() (keep bool) {
	h := &c.head
	r := &c.req
	*r = c.base
	c.w.reset(h)
	// The body is framed before anything is answered: whatever the
	// request, its Content-Length or chunks say where the next one
	// starts (RFC 9112 6.3), and after skips what was not read.
	c.body.reset(h)
	if h.target == "*" && h.method == http.MethodOptions {
		// A server-wide OPTIONS: what net/http answers.
		c.w.Header()["Content-Length"] = []string{"0"}
		c.w.WriteHeader(http.StatusOK)
		c.w.finish()
		return c.after(h)
	}
	u, err := c.parseURL(h.target)
	if err != nil {
		c.refuse(badHead("malformed request target %s", quoteTrunc([]byte(h.target))))
		return false
	}
	r.Method, r.URL, r.RequestURI = h.method, u, h.target
	r.Proto, r.ProtoMajor, r.ProtoMinor = "HTTP/1.1", 1, h.minor
	if h.minor == 0 {
		r.Proto = "HTTP/1.0"
	}
	r.Header, r.Host, r.RemoteAddr, r.Close = c.hr.header, h.host, c.remote, h.close
	if u.Host != "" {
		r.Host = u.Host
	}
	switch {
	case h.chunked:
		r.ContentLength, r.TransferEncoding, r.Body = -1, chunkedTE, &c.body
	case h.contentLength > 0:
		r.ContentLength, r.Body = h.contentLength, &c.body
	default:
		r.ContentLength, r.Body = 0, http.NoBody
	}
	if !c.body.done {
		// since stays the head's first byte: ReadTimeout covers both.
		c.setState(connBody)
	} else {
		c.setState(connWork)
	}
	if !c.runHandler(r) {
		return false
	}
	c.w.finish()
	return c.after(h)
}

// chunkedTE is the TransferEncoding of every chunked request; handlers
// only read it.
var chunkedTE = []string{"chunked"}

// runHandler calls the handler and reports whether it returned normally:
// a panic is logged (http.ErrAbortHandler silently) and the connection
// is closed, its response cut off, as net/http does.
func (c *h1conn) runHandler(r *http.Request) (ok bool) {
	defer func() {
		if ok {
			return
		}
		if p := recover(); p != nil && p != http.ErrAbortHandler {
			c.srv.log.Error("panic serving a request", "remote", c.remote, "panic", p, "stack", string(debug.Stack()))
		}
		c.w.release()
	}()
	c.srv.handler.ServeHTTP(&c.w, r)
	return true
}

// after reports whether the connection takes another request once this
// one's answer is written: not when either side said close, the answer
// could not be written, the server is closing, or the body the handler
// left unread cannot be skipped.
func (c *h1conn) after(h *reqHead) bool {
	if c.w.closeAfter || c.w.err != nil || h.close || c.srv.closing.Load() || c.expired.Load() {
		return false
	}
	return c.body.skipRest()
}

// parseURL parses a request target, reusing the last one's parse when
// the target repeats (clients send the same route request after
// request).
func (c *h1conn) parseURL(target string) (*url.URL, error) {
	if c.lastURL == nil || target != c.urlTarget {
		u, err := url.ParseRequestURI(target)
		if err != nil {
			return nil, err
		}
		c.lastURL, c.urlTarget = u, target
	}
	// A copy, so that a handler changing its request's URL does not
	// change the next one's.
	c.url = *c.lastURL
	return &c.url, nil
}

// h1body is a request's body as the handler reads it: Content-Length
// bytes or chunks from the connection's reader, after the 100 Continue
// the client may be waiting for.
type h1body struct {
	c       *h1conn
	remain  int64
	chunked io.Reader
	done    bool
	err     error
	// expect is set while a 100 Continue is owed before the body.
	expect bool
}

func (b *h1body) reset(h *reqHead) {
	*b = h1body{c: b.c, remain: h.contentLength, expect: h.expectContinue}
	switch {
	case h.chunked:
		b.chunked = newChunkedReader(b.c.br)
	case h.contentLength <= 0:
		b.done, b.expect = true, false
	}
}

func (b *h1body) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.done {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	if b.expect {
		b.expect = false
		if err := b.c.w.sendContinue(); err != nil {
			b.err = err
			return 0, err
		}
	}
	var n int
	var err error
	if b.chunked != nil {
		n, err = b.chunked.Read(p)
		if errors.Is(err, io.EOF) {
			err = b.trailer()
		}
	} else {
		if int64(len(p)) > b.remain {
			p = p[:b.remain]
		}
		n, err = b.c.br.Read(p)
		b.remain -= int64(n)
		if b.remain == 0 {
			err = io.EOF
		} else if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
	}
	if errors.Is(err, io.EOF) {
		b.done = true
		b.c.since.Store(time.Now().UnixNano())
		b.c.setState(connWork)
	} else if err != nil {
		b.err = fmt.Errorf("reading the request body: %w", err)
		err = b.err
	}
	return n, err
}

// trailer reads a chunked body's trailer fields (and drops them), within
// the head's byte and field limits, and returns io.EOF once they end.
// Each line must be a field line (RFC 9112 7.1.2): a front end that ends
// the body at its last chunk's empty line would otherwise see a request
// where kvcar sees a trailer.
func (b *h1body) trailer() error {
	hr := &b.c.hr
	hr.used = 0
	for n := 0; ; n++ {
		line, err := hr.line()
		if err != nil {
			if errors.Is(err, errHeadTooLarge) {
				return fmt.Errorf("trailer exceeds %d bytes", hr.maxBytes)
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		if len(line) == 0 {
			return io.EOF
		}
		if n == maxHeadFields {
			return fmt.Errorf("trailer has more than %d fields", maxHeadFields)
		}
		if _, _, err := fieldLine(line); err != nil {
			return fmt.Errorf("trailer: %w", err)
		}
	}
}

// Close leaves the rest of the body to skipRest.
func (b *h1body) Close() error { return nil }

// skipRest reads and drops what the handler left of the body, up to
// maxDiscardBody, and reports whether the connection is at the next
// request.
func (b *h1body) skipRest() bool {
	if b.done {
		return true
	}
	if b.err != nil || b.expect {
		// Owed a 100 Continue, the client may or may not send the body:
		// the connection's framing is unknown.
		return false
	}
	_, _ = io.CopyN(io.Discard, b, maxDiscardBody)
	return b.done
}
