package baidustd

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kvcar/kvcar/internal/baidustd/metapb"
	"github.com/kvcar/kvcar/internal/testlog"
)

const testSvc = "kvcar.test.Echo"

// startServer runs a server with opts on a loopback port, with the
// methods of echoServer registered, and closes it at the end of the test.
func startServer(t *testing.T, opts ServerOptions, methods map[string]Handler) (string, *Server) {
	t.Helper()
	srv := NewServer(opts)
	for m, h := range methods {
		if err := srv.Register(testSvc, m, h); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		}
	})
	return ln.Addr().String(), srv
}

func echo(_ context.Context, r *Request) (Response, error) {
	return Response{Message: r.Message, Attachment: r.Attachment}, nil
}

func newClient(t *testing.T, addr string, opts ClientOptions) *Client {
	t.Helper()
	c := NewClient(addr, opts)
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func wantError(t *testing.T, err error, code Errno, text string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("got %v, want *Error %d", err, code)
	}
	if e.Code != code || (text != "" && e.Text != text) {
		t.Fatalf("got code %d text %q, want %d %q", e.Code, e.Text, code, text)
	}
}

func TestUnknownServiceAndMethodAsBrpcWordsThem(t *testing.T) {
	addr, _ := startServer(t, ServerOptions{Identity: "10.0.0.1:8889"}, map[string]Handler{"Echo": echo})
	c := newClient(t, addr, ClientOptions{})
	ctx := ctxT(t, 5*time.Second)
	_, err := c.Call(ctx, testSvc, "Nope", nil, nil)
	wantError(t, err, ENOMETHOD, "[10.0.0.1:8889][E1002]Fail to find method=kvcar.test.Echo/Nope")
	_, err = c.Call(ctx, "kvcar.test.Missing", "Echo", nil, nil)
	wantError(t, err, ENOMETHOD, "[10.0.0.1:8889][E1002]Fail to find method=kvcar.test.Missing/Echo")
	// A service name without a package is looked up by its short name,
	// and is ENOSERVICE when no service has it.
	_, err = c.Call(ctx, "Missing", "Echo", nil, nil)
	wantError(t, err, ENOSERVICE, "[10.0.0.1:8889][E1001]Fail to find service=Missing")
	if r, err := c.Call(ctx, "Echo", "Echo", []byte("short"), nil); err != nil || string(r.Message) != "short" {
		t.Fatalf("short service name: %v %q", err, r.Message)
	}
}

func TestHandlerErrorsAsBrpcSendsThem(t *testing.T) {
	addr, _ := startServer(t, ServerOptions{Identity: "h:1"}, map[string]Handler{
		"Plain":  func(context.Context, *Request) (Response, error) { return Response{}, errors.New("boom") },
		"Coded":  func(context.Context, *Request) (Response, error) { return Response{}, Errorf(ELIMIT, "too many") },
		"Panics": func(context.Context, *Request) (Response, error) { panic("bad handler") },
	})
	c := newClient(t, addr, ClientOptions{})
	ctx := ctxT(t, 5*time.Second)
	_, err := c.Call(ctx, testSvc, "Plain", nil, nil)
	// brpc: SetFailed(reason) records -1, sent as EINTERNAL, no [E] part.
	wantError(t, err, EINTERNAL, "[h:1]boom")
	_, err = c.Call(ctx, testSvc, "Coded", nil, nil)
	wantError(t, err, ELIMIT, "[h:1][E2004]too many")
	_, err = c.Call(ctx, testSvc, "Panics", nil, nil)
	wantError(t, err, EINTERNAL, "[h:1][E2001]kvcar.test.Echo/Panics panicked: bad handler")
	// The connection survives every one of them.
	if _, err := c.Call(ctx, testSvc, "Coded", nil, nil); CodeOf(err) != ELIMIT {
		t.Fatalf("after errors: %v", err)
	}
}

func TestHandlerTimeout(t *testing.T) {
	ended := make(chan error, 1)
	addr, _ := startServer(t, ServerOptions{Identity: "h:1", HandlerTimeout: 100 * time.Millisecond}, map[string]Handler{
		"Slow": func(ctx context.Context, _ *Request) (Response, error) {
			<-ctx.Done()
			ended <- ctx.Err()
			time.Sleep(50 * time.Millisecond) // a late answer must not be sent
			return Response{Message: []byte("late")}, nil
		},
		"Echo": echo,
	})
	c := newClient(t, addr, ClientOptions{})
	ctx := ctxT(t, 5*time.Second)
	start := time.Now()
	_, err := c.Call(ctx, testSvc, "Slow", nil, nil)
	wantError(t, err, ERPCTIMEDOUT, "[h:1][E1008]kvcar.test.Echo/Slow did not finish within 100ms")
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("timeout answer took %v", el)
	}
	if e := <-ended; !errors.Is(e, context.DeadlineExceeded) {
		t.Fatalf("handler context ended with %v", e)
	}
	// The late answer is dropped: the next call gets its own answer.
	time.Sleep(80 * time.Millisecond)
	if r, err := c.Call(ctx, testSvc, "Echo", []byte("x"), nil); err != nil || string(r.Message) != "x" {
		t.Fatalf("after a timeout: %v %q", err, r.Message)
	}
}

// A request's own timeout_ms shortens the handler's deadline.
func TestRequestTimeoutMs(t *testing.T) {
	got := make(chan time.Duration, 1)
	addr, _ := startServer(t, ServerOptions{HandlerTimeout: time.Minute}, map[string]Handler{
		"Deadline": func(ctx context.Context, _ *Request) (Response, error) {
			d, _ := ctx.Deadline()
			got <- time.Until(d)
			return Response{}, nil
		},
	})
	m := requestMeta(testSvc, "Deadline", 7, nil, false)
	m.Request.TimeoutMs = proto.Int32(200)
	req, err := AppendFrame(nil, m, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp := exchange(t, addr, req, 1)[0]
	if f, _, err := ParseFrame(resp, DefaultMaxBodySize); err != nil || f.Meta.GetResponse().GetErrorCode() != 0 {
		t.Fatalf("%v %v", err, f.Meta)
	}
	if d := <-got; d > 200*time.Millisecond || d < 100*time.Millisecond {
		t.Fatalf("handler deadline in %v, want about 200ms", d)
	}
}

func TestAttachmentsAndMetaFields(t *testing.T) {
	seen := make(chan *Request, 1)
	addr, _ := startServer(t, ServerOptions{}, map[string]Handler{
		"Echo": func(ctx context.Context, r *Request) (Response, error) {
			seen <- r
			return echo(ctx, r)
		},
	})
	c := newClient(t, addr, ClientOptions{})
	r, err := c.Call(ctxT(t, 5*time.Second), testSvc, "Echo", []byte("msg"),
		&CallOptions{LogID: 42, RequestID: "rid", Attachment: []byte("att")})
	if err != nil || string(r.Message) != "msg" || string(r.Attachment) != "att" {
		t.Fatalf("%v %q %q", err, r.Message, r.Attachment)
	}
	req := <-seen
	if req.LogID != 42 || req.RequestID != "rid" || req.Service != testSvc || req.Method != "Echo" || req.RemoteAddr == nil {
		t.Fatalf("request as seen: %+v", req)
	}
}

// rawCall sends one hand-made request frame and returns the response
// meta.
func rawCall(t *testing.T, addr string, m *metapb.RpcMeta, payload []byte) (*metapb.RpcMeta, []byte) {
	t.Helper()
	b, err := AppendFrame(nil, m, payload, nil)
	if err != nil {
		t.Fatal(err)
	}
	f, _, err := ParseFrame(exchange(t, addr, b, 1)[0], DefaultMaxBodySize)
	if err != nil {
		t.Fatal(err)
	}
	return f.Meta, f.Payload
}

func TestCompression(t *testing.T) {
	addr, _ := startServer(t, ServerOptions{Identity: "h:1", MaxBodySize: 1 << 20}, map[string]Handler{"Echo": echo})
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	w.Write([]byte("compressed hello"))
	w.Close()

	m := requestMeta(testSvc, "Echo", 1, nil, false)
	m.CompressType = proto.Int32(CompressGzip)
	resp, payload := rawCall(t, addr, m, gz.Bytes())
	if resp.GetResponse().GetErrorCode() != 0 || string(payload) != "compressed hello" || resp.GetCompressType() != 0 {
		t.Fatalf("gzip: %v %q", resp, payload)
	}

	m = requestMeta(testSvc, "Echo", 2, nil, false)
	m.CompressType = proto.Int32(CompressSnappy)
	resp, _ = rawCall(t, addr, m, []byte("whatever"))
	if got, want := resp.GetResponse().GetErrorText(), "[h:1][E1003]Fail to parse request message, CompressType=snappy, request_size=8"; resp.GetResponse().GetErrorCode() != int32(EREQUEST) || got != want {
		t.Fatalf("snappy: %d %q, want %q", resp.GetResponse().GetErrorCode(), got, want)
	}

	// A gzip bomb stops at MaxBodySize.
	var bomb bytes.Buffer
	w = gzip.NewWriter(&bomb)
	w.Write(make([]byte, 4<<20))
	w.Close()
	m = requestMeta(testSvc, "Echo", 3, nil, false)
	m.CompressType = proto.Int32(CompressGzip)
	resp, _ = rawCall(t, addr, m, bomb.Bytes())
	if resp.GetResponse().GetErrorCode() != int32(EREQUEST) {
		t.Fatalf("gzip bomb: %v", resp)
	}
}

func TestBadAttachmentSizeAnsweredOnTheCall(t *testing.T) {
	addr, _ := startServer(t, ServerOptions{Identity: "h:1"}, map[string]Handler{"Echo": echo})
	// Claim a 100-byte attachment in a 3-byte payload.
	m := requestMeta(testSvc, "Echo", 9, nil, false)
	m.AttachmentSize = proto.Int32(100)
	mb, _ := proto.Marshal(m)
	b := append(append(frameHeader(uint32(len(mb)+3), uint32(len(mb))), mb...), "abc"...)
	f, _, err := ParseFrame(exchange(t, addr, b, 1)[0], DefaultMaxBodySize)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Meta.GetResponse().GetErrorText(); got != "[h:1][E1003]attachment_size=100 is larger than request_size=3" {
		t.Fatalf("got %q", got)
	}
}

// A bad frame closes its own connection, with the reason logged, and no
// other.
func TestBadFrameClosesOnlyItsConnection(t *testing.T) {
	var logs testlog.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	addr, _ := startServer(t, ServerOptions{MaxBodySize: 1024, Logger: log}, map[string]Handler{"Echo": echo})
	good := newClient(t, addr, ClientOptions{})
	ctx := ctxT(t, 5*time.Second)
	if _, err := good.Call(ctx, testSvc, "Echo", []byte("1"), nil); err != nil {
		t.Fatal(err)
	}
	header := func(magic string, body, meta uint32) []byte {
		return binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32([]byte(magic), body), meta)
	}
	cases := map[string][]byte{
		"oversize":     header(Magic, 1025, 0),
		"bad magic":    header("HTTP", 10, 0),
		"meta > body":  append(header(Magic, 4, 5), 0, 0, 0, 0),
		"bad meta":     append(header(Magic, 3, 3), 0xff, 0xff, 0xff),
		"missing name": append(header(Magic, 4, 4), 0x0a, 0x02, 0x0a, 0x00), // request{service_name:""}, no method_name
	}
	for name, b := range cases {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write(b)
		if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
			t.Errorf("%s: connection answered %d bytes, %v; want it closed", name, n, err)
		}
		c.Close()
		if _, err := good.Call(ctx, testSvc, "Echo", []byte("2"), nil); err != nil {
			t.Fatalf("%s: the other connection failed: %v", name, err)
		}
	}
	for _, want := range []string{"body_size=1025 is larger than the limit 1024", `magic \"HTTP\"`, "meta_size=5 is bigger than body_size=4",
		"RpcMeta does not parse"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
}

func TestIdleConnectionReapedAndClientRedials(t *testing.T) {
	var logs testlog.Buffer
	addr, _ := startServer(t, ServerOptions{IdleTimeout: 100 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))},
		map[string]Handler{"Echo": echo})
	c := newClient(t, addr, ClientOptions{})
	ctx := ctxT(t, 5*time.Second)
	if _, err := c.Call(ctx, testSvc, "Echo", nil, nil); err != nil {
		t.Fatal(err)
	}
	first := c.cc
	deadline := time.Now().Add(3 * time.Second)
	for first.broken() == nil {
		if time.Now().After(deadline) {
			t.Fatal("idle connection not closed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(logs.String(), "idle for 100ms") {
		t.Errorf("no idle reason logged: %s", logs.String())
	}
	if _, err := c.Call(ctx, testSvc, "Echo", nil, nil); err != nil {
		t.Fatalf("call after the reap: %v", err)
	}
	if c.cc == first {
		t.Fatal("client did not dial again")
	}
}

// A connection with a call in flight is not idle, however long the call.
func TestBusyConnectionNotReaped(t *testing.T) {
	addr, _ := startServer(t, ServerOptions{IdleTimeout: 50 * time.Millisecond}, map[string]Handler{
		"Slow": func(ctx context.Context, r *Request) (Response, error) {
			time.Sleep(300 * time.Millisecond)
			return Response{Message: r.Message}, nil
		},
	})
	c := newClient(t, addr, ClientOptions{})
	if r, err := c.Call(ctxT(t, 5*time.Second), testSvc, "Slow", []byte("ok"), nil); err != nil || string(r.Message) != "ok" {
		t.Fatalf("%v %q", err, r.Message)
	}
}

func TestMaxConns(t *testing.T) {
	addr, _ := startServer(t, ServerOptions{MaxConns: 2}, map[string]Handler{"Echo": echo})
	ctx := ctxT(t, 5*time.Second)
	a, b := newClient(t, addr, ClientOptions{}), newClient(t, addr, ClientOptions{})
	for _, c := range []*Client{a, b} {
		if _, err := c.Call(ctx, testSvc, "Echo", nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	_, err := newClient(t, addr, ClientOptions{}).Call(ctx, testSvc, "Echo", nil, nil)
	wantError(t, err, EFAILEDSOCKET, "")
	if _, err := a.Call(ctx, testSvc, "Echo", nil, nil); err != nil {
		t.Fatalf("existing connection after a refusal: %v", err)
	}
}

// Past MaxCallsPerConn the server stops reading the connection until a
// call finishes; every call is still answered.
func TestMaxCallsPerConn(t *testing.T) {
	var running, peak atomic.Int32
	release := make(chan struct{})
	addr, _ := startServer(t, ServerOptions{MaxCallsPerConn: 4}, map[string]Handler{
		"Wait": func(ctx context.Context, r *Request) (Response, error) {
			n := running.Add(1)
			defer running.Add(-1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			<-release
			return Response{Message: r.Message}, nil
		},
	})
	c := newClient(t, addr, ClientOptions{})
	ctx := ctxT(t, 10*time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Go(func() {
			r, err := c.Call(ctx, testSvc, "Wait", []byte{byte(i)}, nil)
			if err == nil && (len(r.Message) != 1 || r.Message[0] != byte(i)) {
				err = fmt.Errorf("call %d got %v", i, r.Message)
			}
			errs <- err
		})
	}
	time.Sleep(200 * time.Millisecond)
	if p := peak.Load(); p != 4 {
		t.Errorf("%d calls ran at once, want 4", p)
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// Shutdown lets a call in flight finish and answers it; new connections
// are refused.
func TestGracefulShutdown(t *testing.T) {
	started := make(chan struct{})
	srv := NewServer(ServerOptions{})
	srv.Register(testSvc, "Slow", func(ctx context.Context, r *Request) (Response, error) {
		close(started)
		time.Sleep(200 * time.Millisecond)
		return Response{Message: []byte("done")}, nil
	})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	c := newClient(t, ln.Addr().String(), ClientOptions{})
	res := make(chan error, 1)
	go func() {
		r, err := c.Call(ctxT(t, 5*time.Second), testSvc, "Slow", nil, nil)
		if err == nil && string(r.Message) != "done" {
			err = fmt.Errorf("got %q", r.Message)
		}
		res <- err
	}()
	<-started
	if err := srv.Shutdown(ctxT(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := <-res; err != nil {
		t.Fatalf("call in flight during shutdown: %v", err)
	}
	if err := <-served; !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve: %v", err)
	}
	if _, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		t.Fatal("listener still accepting")
	}
}

// Shutdown whose context ends first closes everything and ends the
// handlers' contexts.
func TestShutdownDeadline(t *testing.T) {
	ended := make(chan struct{})
	srv := NewServer(ServerOptions{})
	srv.Register(testSvc, "Stuck", func(ctx context.Context, r *Request) (Response, error) {
		<-ctx.Done()
		close(ended)
		return Response{}, ctx.Err()
	})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(ln)
	c := newClient(t, ln.Addr().String(), ClientOptions{})
	res := make(chan error, 1)
	go func() {
		_, err := c.Call(ctxT(t, 5*time.Second), testSvc, "Stuck", nil, nil)
		res <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if err := srv.Shutdown(ctxT(t, 100*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown: %v", err)
	}
	<-ended
	if err := <-res; CodeOf(err) != EFAILEDSOCKET {
		t.Fatalf("call cut off by shutdown: %v", err)
	}
}

// Many connections at once, each with pipelined calls, all answered
// with their own data.
func TestConcurrentConnections(t *testing.T) {
	addr, _ := startServer(t, ServerOptions{}, map[string]Handler{"Echo": echo})
	ctx := ctxT(t, 10*time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 16*20)
	for i := range 16 {
		c := newClient(t, addr, ClientOptions{ExtendedMeta: i%2 == 0})
		for j := range 20 {
			wg.Go(func() {
				want := fmt.Sprintf("%d/%d", i, j)
				r, err := c.Call(ctx, testSvc, "Echo", []byte(want), nil)
				if err == nil && string(r.Message) != want {
					err = fmt.Errorf("sent %q got %q", want, r.Message)
				}
				errs <- err
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// goroutineID is the id runtime.Stack prints for the calling goroutine.
func goroutineID() string {
	var b [64]byte
	s := string(b[:runtime.Stack(b[:], false)])
	s = strings.TrimPrefix(s, "goroutine ")
	return s[:strings.IndexByte(s, ' ')]
}

// Calls that follow each other on a connection run on the worker kept
// from the calls before, not on a goroutine each (whose stack would grow
// from the minimum every time); a worker left idle for workerIdle exits,
// and the next call starts another. Concurrent calls still get workers of
// their own (TestMaxCallsPerConn, TestClientPipelinesOnOneConnection).
func TestWorkersKeptBetweenCalls(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	var last string
	record := func(_ context.Context, r *Request) (Response, error) {
		id := goroutineID()
		mu.Lock()
		seen[id]++
		last = id
		mu.Unlock()
		return Response{Message: r.Message}, nil
	}
	addr, _ := startServer(t, ServerOptions{}, map[string]Handler{"Record": record})
	c := newClient(t, addr, ClientOptions{})
	ctx := ctxT(t, 20*time.Second)
	const calls = 200
	for range calls {
		if _, err := c.Call(ctx, testSvc, "Record", []byte("x"), nil); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	workers, before := len(seen), last
	mu.Unlock()
	// A call can come while the worker is still between its response and
	// its wait for the next; it then gets a new worker. Most must not.
	if workers > calls/4 {
		t.Fatalf("%d sequential calls ran on %d goroutines, want the workers reused", calls, workers)
	}
	time.Sleep(workerIdle + 300*time.Millisecond)
	if _, err := c.Call(ctx, testSvc, "Record", []byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if last == before || seen[last] != 1 {
		t.Fatalf("after %v idle the call ran on goroutine %s (the last before: %s, calls on it: %d), want a new worker",
			workerIdle+300*time.Millisecond, last, before, seen[last])
	}
	t.Logf("%d sequential calls on %d workers", calls, workers)
}

// frameHeader is a frame's header announcing body and meta bytes.
func frameHeader(body, meta uint32) []byte {
	return binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32([]byte(Magic), body), meta)
}
