package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/sockio"

	"github.com/prometheus/client_golang/prometheus"
)

// serveH1 serves h by an HTTP1Server on loopback until the test ends. It
// returns an httptest.Server whose URL and Client reach it (its own
// net/http server is given a listener that never accepts), so that tests
// written against net/http's server run unchanged against kvcar's.
func serveH1(t *testing.T, h http.Handler, o HTTP1Options) *httptest.Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := NewHTTP1Server(h, o)
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	ts := httptest.NewUnstartedServer(http.NotFoundHandler())
	ts.Listener.Close()
	ts.Listener = &idleListener{addr: ln.Addr(), closed: make(chan struct{})}
	ts.Start()
	t.Cleanup(func() {
		ts.Close()
		hs.Close()
		if err := <-served; err != http.ErrServerClosed {
			t.Errorf("Serve returned %v, want http.ErrServerClosed", err)
		}
	})
	return ts
}

// idleListener has an address and accepts nothing until closed.
type idleListener struct {
	addr   net.Addr
	closed chan struct{}
}

func (l *idleListener) Accept() (net.Conn, error) {
	<-l.closed
	return nil, net.ErrClosed
}

func (l *idleListener) Close() error {
	select {
	case <-l.closed:
	default:
		close(l.closed)
	}
	return nil
}

func (l *idleListener) Addr() net.Addr { return l.addr }

// h1Stack is kvcar's public routes (RR over engines, ready) served by an
// HTTP1Server with o on loopback; it returns the address and the server.
func h1Stack(t *testing.T, opts Options, o HTTP1Options, engines ...string) (string, *HTTP1Server) {
	t.Helper()
	opts.Router = routerFor(t, engines...)
	s := New(opts)
	s.SetReady(true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := NewHTTP1Server(s.Handler(), o)
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	t.Cleanup(func() {
		hs.Close()
		<-served
	})
	return ln.Addr().String(), hs
}

// rawConn is a client connection that writes bytes as given and reads
// answers with net/http's parser.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

func (rc *rawConn) send(s string) {
	rc.t.Helper()
	if _, err := io.WriteString(rc.c, s); err != nil {
		rc.t.Fatal(err)
	}
}

// answer reads one answer to a request of method and its whole body.
func (rc *rawConn) answer(method string) (*http.Response, string) {
	rc.t.Helper()
	resp, err := http.ReadResponse(rc.br, &http.Request{Method: method})
	if err != nil {
		rc.t.Fatalf("reading an answer: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		rc.t.Fatalf("reading an answer's body: %v", err)
	}
	return resp, string(b)
}

// closed reports whether the server closed the connection (EOF or a
// reset) within d, with nothing more sent.
func (rc *rawConn) closed(d time.Duration) bool {
	rc.t.Helper()
	_ = rc.c.SetReadDeadline(time.Now().Add(d))
	b, err := rc.br.ReadByte()
	if err == nil {
		rc.t.Fatalf("unexpected byte %q after the answer", b)
	}
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

func completionRequest(body string, extra ...string) string {
	return "POST /v1/completions HTTP/1.1\r\nHost: kvcar\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n" + strings.Join(extra, "") + "\r\n" + body
}

// TestH1KeepAliveAndPipelining: requests pipelined in one write are
// answered in order on the kept connection, and a completion among them
// reaches the engine byte for byte.
func TestH1KeepAliveAndPipelining(t *testing.T) {
	engine, got := recordingEngine(t)
	addr, _ := h1Stack(t, Options{}, HTTP1Options{}, engine)
	rc := dialRaw(t, addr)
	body := `{"prompt":[1,2,3],"max_tokens":1}`
	rc.send("GET /health HTTP/1.1\r\nHost: kvcar\r\n\r\n" + completionRequest(body) + "GET /ready HTTP/1.1\r\nHost: kvcar\r\n\r\n")
	for i, want := range []string{`{"status":"ok"}`, `{"choices":[{"text":"ok"}]}`, `{"ready":true}`} {
		resp, b := rc.answer(http.MethodGet)
		if resp.StatusCode != http.StatusOK || strings.TrimSpace(b) != want || resp.Close {
			t.Fatalf("answer %d: %d %q close=%v, want 200 %s kept", i, resp.StatusCode, b, resp.Close, want)
		}
		if resp.ContentLength != int64(len(b)) {
			t.Errorf("answer %d: Content-Length %d for %d bytes", i, resp.ContentLength, len(b))
		}
	}
	if s := <-got; string(s.body) != body {
		t.Errorf("engine got %q, want %q", s.body, body)
	}
	// Still open for another.
	rc.send("GET /health HTTP/1.1\r\nHost: kvcar\r\n\r\n")
	if resp, _ := rc.answer(http.MethodGet); resp.StatusCode != http.StatusOK {
		t.Errorf("fourth request: %d", resp.StatusCode)
	}
}

// TestH1LargeRequestsPipelined: completions with bodies below, around
// and past inBufSize, pipelined in one write, reach the engine byte for
// byte and are answered in order, the bytes of each one read with the
// one before staying for it.
func TestH1LargeRequestsPipelined(t *testing.T) {
	engine, got := recordingEngine(t)
	addr, _ := h1Stack(t, Options{}, HTTP1Options{}, engine)
	rc := dialRaw(t, addr)
	var bodies []string
	var all strings.Builder
	for _, ids := range []int{2000, 9000, 12000, 300, 20000} {
		var b strings.Builder
		b.WriteString(`{"max_tokens":1,"prompt":[`)
		for i := range ids {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(100000 + i))
		}
		b.WriteString(`]}`)
		bodies = append(bodies, b.String())
		all.WriteString(completionRequest(b.String()))
	}
	rc.send(all.String())
	for i, body := range bodies {
		resp, b := rc.answer(http.MethodPost)
		if resp.StatusCode != http.StatusOK || resp.Close {
			t.Fatalf("answer %d: %d %q close=%v", i, resp.StatusCode, b, resp.Close)
		}
		if s := <-got; string(s.body) != body {
			t.Fatalf("request %d: the engine got %d bytes, want the %d sent", i, len(s.body), len(body))
		}
	}
}

// TestSpillReaderOneRead: a request of 20 KB that has arrived whole is
// taken from the socket by the bufio.Reader's first read, what its
// buffer has no room for kept for the reads after; once they have it
// all, the pool's buffer has gone back and the next read waits for the
// socket.
func TestSpillReaderOneRead(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	msg := strings.Repeat("0123456789", 2048)
	if _, err := io.WriteString(client, msg); err != nil {
		t.Fatal(err)
	}
	var pool sync.Pool
	pool.New = func() any { b := make([]byte, inBufSize); return &b }
	in := newSpillReader(sockio.New(server), &pool)
	br := bufio.NewReaderSize(in, readBufSize)
	// Loopback delivers the message within microseconds; the first read
	// comes well after.
	time.Sleep(100 * time.Millisecond)
	if _, err := br.Peek(1); err != nil {
		t.Fatal(err)
	}
	if br.Buffered() != readBufSize || in.buffered() != len(msg)-readBufSize {
		t.Fatalf("first read: %d bytes in the bufio.Reader, %d kept, want %d and %d", br.Buffered(), in.buffered(), readBufSize, len(msg)-readBufSize)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(br, got); err != nil || string(got) != msg {
		t.Fatalf("read %d bytes, %v", len(got), err)
	}
	if in.taken != nil || in.buffered() != 0 {
		t.Fatal("the pool's buffer was kept after its bytes were read")
	}
	_ = server.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := br.ReadByte(); !errors.Is(err, os.ErrDeadlineExceeded) || in.taken != nil {
		t.Fatalf("a read with nothing to read: %v, holding a buffer %v", err, in.taken != nil)
	}
}

// TestH1ConnectionCloseAndHTTP10: "Connection: close" and HTTP/1.0
// without keep-alive get their answer marked so and the connection ends;
// HTTP/1.0 with keep-alive keeps it.
func TestH1ConnectionCloseAndHTTP10(t *testing.T) {
	engine, _ := recordingEngine(t)
	addr, _ := h1Stack(t, Options{}, HTTP1Options{}, engine)
	for _, req := range []string{
		"GET /health HTTP/1.1\r\nHost: kvcar\r\nConnection: close\r\n\r\n",
		"GET /health HTTP/1.0\r\n\r\n",
		completionRequest(`{"prompt":[1]}`, "Connection: close\r\n"),
	} {
		rc := dialRaw(t, addr)
		rc.send(req)
		resp, b := rc.answer(http.MethodGet)
		// net/http's reader takes "Connection: close" into resp.Close.
		if resp.StatusCode != http.StatusOK || !resp.Close {
			t.Errorf("%q: %d %q, close %v; want 200 and close", req, resp.StatusCode, b, resp.Close)
		}
		if !rc.closed(5 * time.Second) {
			t.Errorf("%q: the connection stayed open", req)
		}
	}
	rc := dialRaw(t, addr)
	for i := range 2 {
		rc.send("GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
		resp, b := rc.answer(http.MethodGet)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Connection") != "keep-alive" || resp.ContentLength != int64(len(b)) {
			t.Fatalf("HTTP/1.0 keep-alive request %d: %d, Connection %q, length %d for %q", i, resp.StatusCode,
				resp.Header.Get("Connection"), resp.ContentLength, b)
		}
	}
}

// TestH1RefusesSmuggling: a request framed two ways (Content-Length and
// chunked, Content-Lengths that differ), an unknown transfer coding or a
// malformed length is refused, naming what is wrong, in kvcar's error
// body (R-API-5's shape), and the connection is closed: what follows
// could be anything. Repeats of one length are taken, as net/http takes
// them.
func TestH1RefusesSmuggling(t *testing.T) {
	engine, got := recordingEngine(t)
	addr, _ := h1Stack(t, Options{}, HTTP1Options{}, engine)
	body := `{"prompt":[1]}`
	n := strconv.Itoa(len(body))
	for _, c := range []struct {
		head   string
		status int
		want   string
	}{
		{"Content-Length: " + n + "\r\nTransfer-Encoding: chunked\r\n", 400, "both Content-Length and Transfer-Encoding"},
		{"Transfer-Encoding: chunked\r\nContent-Length: " + n + "\r\n", 400, "both Content-Length and Transfer-Encoding"},
		{"Content-Length: " + n + "\r\nContent-Length: 3\r\n", 400, "conflicting Content-Length"},
		{"Content-Length: +" + n + "\r\n", 400, "invalid Content-Length"},
		{"Content-Length: -1\r\n", 400, "invalid Content-Length"},
		{"Content-Length: " + n + ", " + n + "\r\n", 400, "invalid Content-Length"},
		{"Transfer-Encoding: gzip, chunked\r\n", 501, "unsupported Transfer-Encoding"},
		{"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", 501, "unsupported Transfer-Encoding"},
	} {
		rc := dialRaw(t, addr)
		rc.send("POST /v1/completions HTTP/1.1\r\nHost: kvcar\r\n" + c.head + "\r\n" + body)
		resp, b := rc.answer(http.MethodPost)
		checkError(t, resp, []byte(b), c.status, c.want)
		if !resp.Close || !rc.closed(5*time.Second) {
			t.Errorf("%q: connection kept after the refusal", c.head)
		}
	}
	rc := dialRaw(t, addr)
	rc.send("GET /health HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
	resp, b := rc.answer(http.MethodGet)
	checkError(t, resp, []byte(b), 400, "Transfer-Encoding in an HTTP/1.0 request")

	rc = dialRaw(t, addr)
	rc.send(completionRequest(body, "Content-Length: "+n+"\r\n"))
	if resp, b := rc.answer(http.MethodPost); resp.StatusCode != http.StatusOK {
		t.Errorf("a repeated equal Content-Length: %d %s", resp.StatusCode, b)
	}
	if s := <-got; string(s.body) != body {
		t.Errorf("engine got %q", s.body)
	}
}

// TestH1HeadLimits: heads past the byte limit (many fields or one long
// line) get 431; malformed request lines and fields, a missing or
// repeated Host and other HTTP versions are refused naming the fault;
// HTTP/2's preface (h2c with prior knowledge) gets 505: kvcar serves no
// HTTP/2.
func TestH1HeadLimits(t *testing.T) {
	engine, _ := recordingEngine(t)
	addr, _ := h1Stack(t, Options{}, HTTP1Options{MaxHeaderBytes: 8 << 10}, engine)
	many := strings.Repeat("X-Pad: "+strings.Repeat("a", 90)+"\r\n", 100)
	for _, c := range []struct {
		req    string
		status int
		want   string
	}{
		{"GET /health HTTP/1.1\r\nHost: kvcar\r\n" + many + "\r\n", 431, "request head exceeds 8192 bytes"},
		{"GET /health HTTP/1.1\r\nHost: kvcar\r\nX-Long: " + strings.Repeat("b", 20<<10) + "\r\n\r\n", 431, "request head exceeds"},
		{"GET /" + strings.Repeat("c", 20<<10) + " HTTP/1.1\r\nHost: kvcar\r\n\r\n", 431, "request head exceeds"},
		{"GET /health\r\nHost: kvcar\r\n\r\n", 400, "malformed request line"},
		{"GET  HTTP/1.1\r\nHost: kvcar\r\n\r\n", 400, "malformed request line"},
		{"G(T /health HTTP/1.1\r\nHost: kvcar\r\n\r\n", 400, "invalid method"},
		{"GET /health HTTP/1.x\r\nHost: kvcar\r\n\r\n", 400, "malformed HTTP version"},
		{"GET /health HTTP/2.0\r\nHost: kvcar\r\n\r\n", 505, "not supported"},
		{"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505, "HTTP version 2.0 not supported"},
		{"GET /health HTTP/1.1\r\n\r\n", 400, "missing Host header"},
		{"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "more than one Host header"},
		{"GET /health HTTP/1.1\r\nHost: a b\r\n\r\n", 400, "invalid Host header"},
		{"GET /health HTTP/1.1\r\nHost: kvcar\r\nBad Name: x\r\n\r\n", 400, "malformed header line"},
		{"GET /health HTTP/1.1\r\nHost: kvcar\r\nNoColon\r\n\r\n", 400, "malformed header line"},
		{"GET /health HTTP/1.1\r\nHost: kvcar\r\nX-A: 1\r\n folded\r\n\r\n", 400, "obsolete line folding"},
		{"GET /health HTTP/1.1\r\nHost: kvcar\r\nX-A: a\x01b\r\n\r\n", 400, "invalid character in the value of header"},
		{"GET /he\x7flth HTTP/1.1\r\nHost: kvcar\r\n\r\n", 400, "invalid character in the request target"},
		{"GET health HTTP/1.1\r\nHost: kvcar\r\n\r\n", 400, "malformed request target"},
		{"POST /v1/completions HTTP/1.1\r\nHost: kvcar\r\nExpect: 200-ok\r\n\r\n", 417, "unsupported Expect"},
	} {
		rc := dialRaw(t, addr)
		rc.send(c.req)
		resp, b := rc.answer(http.MethodGet)
		if resp.StatusCode != c.status || !strings.Contains(b, c.want) {
			t.Errorf("%.60q: %d %s, want %d naming %q", c.req, resp.StatusCode, b, c.status, c.want)
		}
		if !rc.closed(5 * time.Second) {
			t.Errorf("%.60q: connection kept after the refusal", c.req)
		}
	}
	// Within the limit, a long head is served.
	rc := dialRaw(t, addr)
	rc.send("GET /health HTTP/1.1\r\nHost: kvcar\r\n" + strings.Repeat("X-Pad: "+strings.Repeat("a", 90)+"\r\n", 50) + "\r\n")
	if resp, b := rc.answer(http.MethodGet); resp.StatusCode != http.StatusOK {
		t.Errorf("a 5 KB head: %d %s", resp.StatusCode, b)
	}
}

// TestH1ExpectContinue: a client waiting with Expect: 100-continue gets
// "100 Continue" once kvcar reads the body, then the answer; one whose
// Content-Length is over the body limit gets 413 at once, with no 100
// Continue, and the connection ends (its body may or may not follow).
func TestH1ExpectContinue(t *testing.T) {
	engine, got := recordingEngine(t)
	addr, _ := h1Stack(t, Options{MaxRequestBodyBytes: 1 << 10}, HTTP1Options{}, engine)
	body := `{"prompt":[7,8]}`
	rc := dialRaw(t, addr)
	rc.send("POST /v1/completions HTTP/1.1\r\nHost: kvcar\r\nExpect: 100-continue\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n")
	line, err := rc.br.ReadString('\n')
	if err != nil || line != "HTTP/1.1 100 Continue\r\n" {
		t.Fatalf("first line %q (%v), want 100 Continue", line, err)
	}
	if blank, _ := rc.br.ReadString('\n'); blank != "\r\n" {
		t.Fatalf("100 Continue followed by %q", blank)
	}
	rc.send(body)
	if resp, b := rc.answer(http.MethodPost); resp.StatusCode != http.StatusOK {
		t.Fatalf("after 100 Continue: %d %s", resp.StatusCode, b)
	}
	if s := <-got; string(s.body) != body {
		t.Errorf("engine got %q", s.body)
	}

	rc = dialRaw(t, addr)
	rc.send("POST /v1/completions HTTP/1.1\r\nHost: kvcar\r\nExpect: 100-continue\r\nContent-Length: 5000\r\n\r\n")
	resp, b := rc.answer(http.MethodPost)
	checkError(t, resp, []byte(b), http.StatusRequestEntityTooLarge, "request body exceeds 1024 bytes")
	if !rc.closed(5 * time.Second) {
		t.Error("connection kept with a body that may follow unread")
	}
}

// TestH1ChunkedBody: a chunked body, with chunk extensions and a
// trailer, reaches the engine as its bytes; a chunked body over the limit
// gets 413 naming it; malformed chunking gets 400 naming the body read.
func TestH1ChunkedBody(t *testing.T) {
	engine, got := recordingEngine(t)
	addr, _ := h1Stack(t, Options{MaxRequestBodyBytes: 1 << 10}, HTTP1Options{}, engine)
	rc := dialRaw(t, addr)
	rc.send("POST /v1/completions HTTP/1.1\r\nHost: kvcar\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"6;ext=1\r\n{\"prom\r\n8\r\npt\":[5]}\r\n0\r\nX-Trailer: t\r\n\r\n")
	if resp, b := rc.answer(http.MethodPost); resp.StatusCode != http.StatusOK {
		t.Fatalf("chunked: %d %s", resp.StatusCode, b)
	}
	if s := <-got; string(s.body) != `{"prompt":[5]}` {
		t.Errorf("engine got %q", s.body)
	}
	// The connection is at the next request after the trailer.
	rc.send("GET /health HTTP/1.1\r\nHost: kvcar\r\n\r\n")
	if resp, _ := rc.answer(http.MethodGet); resp.StatusCode != http.StatusOK {
		t.Errorf("request after a chunked one: %d", resp.StatusCode)
	}

	rc = dialRaw(t, addr)
	big := `{"prompt":[1],"pad":"` + strings.Repeat("x", 2000) + `"}`
	rc.send("POST /v1/completions HTTP/1.1\r\nHost: kvcar\r\nTransfer-Encoding: chunked\r\n\r\n" +
		strconv.FormatInt(int64(len(big)), 16) + "\r\n" + big + "\r\n0\r\n\r\n")
	resp, b := rc.answer(http.MethodPost)
	checkError(t, resp, []byte(b), http.StatusRequestEntityTooLarge, "1024")

	rc = dialRaw(t, addr)
	rc.send("POST /v1/completions HTTP/1.1\r\nHost: kvcar\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")
	resp, b = rc.answer(http.MethodPost)
	checkError(t, resp, []byte(b), http.StatusBadRequest, "reading the request body")
	if !rc.closed(5 * time.Second) {
		t.Error("connection kept after a malformed chunked body")
	}
}

// TestH1Timeouts: a head that does not complete within ReadHeaderTimeout,
// a body that stalls past ReadTimeout and a kept connection idle past
// IdleTimeout are each ended, within a watcher tick or so of the limit.
func TestH1Timeouts(t *testing.T) {
	engine, _ := recordingEngine(t)
	const limit = 400 * time.Millisecond
	addr, _ := h1Stack(t, Options{}, HTTP1Options{ReadHeaderTimeout: limit, ReadTimeout: 2 * limit, IdleTimeout: limit}, engine)
	bound := limit + 3*watchTick + time.Second

	rc := dialRaw(t, addr)
	start := time.Now()
	rc.send("GET /health HTTP/1.1\r\nHost: kv")
	if !rc.closed(bound) {
		t.Fatalf("an unfinished head kept its connection for %v", bound)
	}
	if took := time.Since(start); took < limit {
		t.Errorf("an unfinished head was cut after %v, before ReadHeaderTimeout %v", took, limit)
	}

	rc = dialRaw(t, addr)
	start = time.Now()
	rc.send("POST /v1/completions HTTP/1.1\r\nHost: kvcar\r\nContent-Length: 100\r\n\r\n{\"prompt\":[")
	resp, b := rc.answer(http.MethodPost)
	checkError(t, resp, []byte(b), http.StatusBadRequest, "reading the request body")
	if took := time.Since(start); took < 2*limit || took > 2*limit+bound {
		t.Errorf("a stalled body was answered after %v, want about ReadTimeout %v", took, 2*limit)
	}
	if !rc.closed(bound) {
		t.Error("connection kept after a stalled body")
	}

	rc = dialRaw(t, addr)
	rc.send("GET /health HTTP/1.1\r\nHost: kvcar\r\n\r\n")
	if resp, _ := rc.answer(http.MethodGet); resp.StatusCode != http.StatusOK {
		t.Fatalf("health: %d", resp.StatusCode)
	}
	start = time.Now()
	if !rc.closed(bound) {
		t.Fatalf("an idle connection was kept for %v", bound)
	}
	if took := time.Since(start); took < limit-watchTick {
		t.Errorf("an idle connection was closed after %v, before IdleTimeout %v", took, limit)
	}
}

// TestH1ClientGoneCancelsEngineRequest: a client that closes its
// connection while the engine works has the engine request cancelled (the
// engine sees its connection end), found by the watcher's peek: kvcar
// does not read the client while the engine works.
func TestH1ClientGoneCancelsEngineRequest(t *testing.T) {
	started := make(chan struct{}, 1)
	cancelled := make(chan struct{}, 1)
	engine := startEngine(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		started <- struct{}{}
		select {
		case <-r.Context().Done():
			cancelled <- struct{}{}
		case <-time.After(20 * time.Second):
		}
	})
	addr, _ := h1Stack(t, Options{}, HTTP1Options{}, engine)
	rc := dialRaw(t, addr)
	rc.send(completionRequest(`{"prompt":[1,2]}`))
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the engine did not get the request")
	}
	gone := time.Now()
	rc.c.Close()
	select {
	case <-cancelled:
		t.Logf("engine request cancelled %v after the client closed", time.Since(gone).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatal("the engine request went on for 10 s after its client closed")
	}
}

// TestH1StreamingRelayedAsItComes: an SSE answer reaches the client event
// by event (each before the engine writes the next), chunked.
func TestH1StreamingRelayedAsItComes(t *testing.T) {
	next := make(chan struct{})
	engine := startEngine(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "data: {\"n\":%d}\n\n", i)
			w.(http.Flusher).Flush()
			select {
			case <-next:
			case <-time.After(10 * time.Second):
				return
			}
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	addr, _ := h1Stack(t, Options{}, HTTP1Options{}, engine)
	rc := dialRaw(t, addr)
	rc.send(completionRequest(`{"prompt":[1],"stream":true}`))
	resp, err := http.ReadResponse(rc.br, &http.Request{Method: http.MethodPost})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" ||
		resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream answer: %d %v %q", resp.StatusCode, resp.TransferEncoding, resp.Header.Get("Content-Type"))
	}
	events := bufio.NewReader(resp.Body)
	for i := range 3 {
		line, err := events.ReadString('\n')
		if err != nil || line != fmt.Sprintf("data: {\"n\":%d}\n", i) {
			t.Fatalf("event %d: %q %v", i, line, err)
		}
		_, _ = events.ReadString('\n')
		next <- struct{}{}
	}
	rest, err := io.ReadAll(events)
	if err != nil || string(rest) != "data: [DONE]\n\n" {
		t.Fatalf("end of stream %q %v", rest, err)
	}
	// The connection is kept after a chunked answer.
	rc.send("GET /health HTTP/1.1\r\nHost: kvcar\r\n\r\n")
	if resp, _ := rc.answer(http.MethodGet); resp.StatusCode != http.StatusOK {
		t.Errorf("after a stream: %d", resp.StatusCode)
	}
}

// TestH1GracefulShutdown: Shutdown closes idle connections at once,
// refuses new ones, lets the request in flight finish (its answer saying
// the connection closes) and returns then; Serve returns
// http.ErrServerClosed.
func TestH1GracefulShutdown(t *testing.T) {
	release, started := make(chan struct{}), make(chan struct{}, 1)
	engine := startEngine(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		started <- struct{}{}
		<-release
		_, _ = io.WriteString(w, `{"choices":[]}`)
	})
	s := New(Options{Router: routerFor(t, engine)})
	s.SetReady(true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := NewHTTP1Server(s.Handler(), HTTP1Options{})
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	t.Cleanup(func() { hs.Close() })
	addr := ln.Addr().String()

	idle := dialRaw(t, addr)
	idle.send("GET /health HTTP/1.1\r\nHost: kvcar\r\n\r\n")
	idle.answer(http.MethodGet)
	busy := dialRaw(t, addr)
	busy.send(completionRequest(`{"prompt":[1]}`))
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the engine did not get the request")
	}

	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		shut <- hs.Shutdown(ctx)
	}()
	if !idle.closed(5 * time.Second) {
		t.Error("an idle connection was kept during shutdown")
	}
	select {
	case err := <-served:
		if err != http.ErrServerClosed {
			t.Errorf("Serve returned %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("Serve did not return")
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Error("a new connection was accepted during shutdown")
	}
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned (%v) with a request in flight", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	resp, b := busy.answer(http.MethodPost)
	if resp.StatusCode != http.StatusOK || !resp.Close {
		t.Errorf("in-flight request: %d %s close=%v, want 200 and close", resp.StatusCode, b, resp.Close)
	}
	select {
	case err := <-shut:
		if err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return after the last request")
	}
}

// TestH1ResponseFraming: a handler's answer of unknown length is sent
// with its length when it fits the buffer, chunked when longer or
// flushed (HTTP/1.1), up to the connection's end in HTTP/1.0; a HEAD gets
// the head only; a 204 no body; an unset Content-Type is sniffed; a
// handler's panic closes the connection and the server goes on.
func TestH1ResponseFraming(t *testing.T) {
	big := strings.Repeat("z", outBufSize+10)
	mux := http.NewServeMux()
	mux.HandleFunc("/small", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "<html>hi</html>") })
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, big) })
	mux.HandleFunc("/flushed", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "one ")
		w.(http.Flusher).Flush()
		_, _ = io.WriteString(w, "two")
	})
	mux.HandleFunc("/empty", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("/panic", func(w http.ResponseWriter, r *http.Request) { panic("handler fault") })
	ts := serveH1(t, mux, HTTP1Options{})
	addr := strings.TrimPrefix(ts.URL, "http://")

	rc := dialRaw(t, addr)
	for _, c := range []struct {
		method, path string
		length       int64
		chunked      bool
		body, ctype  string
	}{
		{"GET", "/small", 15, false, "<html>hi</html>", "text/html; charset=utf-8"},
		{"GET", "/big", -1, true, big, "text/plain; charset=utf-8"},
		{"GET", "/flushed", -1, true, "one two", "text/plain; charset=utf-8"},
		{"HEAD", "/small", -1, false, "", ""},
		{"GET", "/empty", 0, false, "", ""},
	} {
		rc.send(c.method + " " + c.path + " HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, b := rc.answer(c.method)
		chunked := len(resp.TransferEncoding) > 0
		if resp.ContentLength != c.length || chunked != c.chunked || b != c.body || resp.Header.Get("Content-Type") != c.ctype ||
			resp.Header.Get("Date") == "" {
			t.Errorf("%s %s: length %d chunked %v type %q date %q body %.20q", c.method, c.path, resp.ContentLength, chunked,
				resp.Header.Get("Content-Type"), resp.Header.Get("Date"), b)
		}
	}
	rc = dialRaw(t, addr)
	rc.send("GET /big HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
	resp, b := rc.answer(http.MethodGet)
	if b != big || !resp.Close {
		t.Errorf("HTTP/1.0 answer of unknown length: %d bytes, close %v; want it whole and the connection closed", len(b), resp.Close)
	}
	rc = dialRaw(t, addr)
	rc.send("GET /panic HTTP/1.1\r\nHost: x\r\n\r\n")
	if !rc.closed(5 * time.Second) {
		t.Error("connection kept after a handler panic")
	}
	rc = dialRaw(t, addr)
	rc.send("GET /small HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, _ := rc.answer(http.MethodGet); resp.StatusCode != http.StatusOK {
		t.Errorf("after a panic: %d", resp.StatusCode)
	}
}

// TestH1Metrics: requests served by the loop are counted by route and
// status as under net/http, the mux's pattern naming the route.
func TestH1Metrics(t *testing.T) {
	engine, _ := recordingEngine(t)
	reg := prometheus.NewRegistry()
	addr, _ := h1Stack(t, Options{Metrics: reg}, HTTP1Options{}, engine)
	rc := dialRaw(t, addr)
	rc.send(completionRequest(`{"prompt":[1]}`) + completionRequest(`{"prompt":"x`))
	rc.answer(http.MethodPost)
	rc.answer(http.MethodPost)
	counts := requestCounts(t, reg)
	for _, want := range []string{"code=200 route=/v1/completions ", "code=400 route=/v1/completions "} {
		if counts[want] != 1 {
			t.Errorf("kvcar_http_requests_total{%s} = %v; all: %v", want, counts[want], counts)
		}
	}
}

// requestCounts returns kvcar_http_requests_total's series in reg, keyed
// by their labels ("code=200 route=/v1/completions ").
func requestCounts(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "kvcar_http_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			key := ""
			for _, l := range m.GetLabel() {
				key += l.GetName() + "=" + l.GetValue() + " "
			}
			counts[key] = m.GetCounter().GetValue()
		}
	}
	return counts
}

// TestH1RefusedLargeBodyAnswerArrives: a handler that answers without
// reading a large body (as kvcar does when the body would exceed its
// in-flight bytes) has its answer reach a client still writing the body,
// every time: closing at once with megabytes unread resets the
// connection, and the reset can reach the client's writer before its
// reader has the answer (R-API-5).
func TestH1RefusedLargeBodyAnswerArrives(t *testing.T) {
	ts := serveH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "busy", http.StatusServiceUnavailable)
	}), HTTP1Options{})
	body := strings.Repeat("x", 8<<20)
	for i := range 10 {
		resp, err := ts.Client().Post(ts.URL+"/", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
}
