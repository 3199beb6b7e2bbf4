package server

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/testlog"
	"github.com/kvcar/kvcar/internal/tokenizer"
)

// seen is what an engine received.
type seen struct {
	body   []byte
	header http.Header
}

// recordingEngine is a real HTTP engine that keeps every request body
// and answers a short completion.
func recordingEngine(t *testing.T) (string, chan seen) {
	got := make(chan seen, 16)
	addr := startEngine(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{body: b, header: r.Header.Clone()}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"text":"ok"}]}`)
	})
	return addr, got
}

// routedServer serves opts with an RR router over engines.
func routedServer(t *testing.T, opts Options, engines ...string) *httptest.Server {
	t.Helper()
	opts.Router = routerFor(t, engines...)
	return startPublicServer(t, opts)
}

// TestInferenceRelaysOriginalBytes covers issue 10 item 3 and issue 13:
// the engine receives the client's body byte for byte (spacing, escapes,
// number forms and unknown members as sent, chunked or not), except that
// a top-level "routing" value is replaced by kvcar's decision; the
// decision also goes in the X-Prefill-Name header.
func TestInferenceRelaysOriginalBytes(t *testing.T) {
	engine, got := recordingEngine(t)
	ts := routedServer(t, Options{}, engine)
	mine := `{"prefill_name":"` + engine + `","decode_name":""}`
	for _, tc := range []struct{ sent, want string }{
		{`{"model":"m",  "prompt":[1,2,3] ,"x":"\u00e9\/", "n":1.50e0, "stream":false}`, ""},
		{`{"prompt":"hello","extra":{"routing":{"prefill_name":"10.0.0.9:1"}}}`, ""},
		{`{"routing" : {"prefill_name":"10.0.0.9:1","decode_name":"10.0.0.9:2"} , "prompt":[1]}`,
			`{"routing" : ` + mine + ` , "prompt":[1]}`},
		{`{"prompt":[[1,2],[3]],"routing":"anything","max_tokens":3}`, `{"prompt":[[1,2],[3]],"routing":` + mine + `,"max_tokens":3}`},
		{"{\"prompt\":[7],\n\"routing\":\tnull\n}", "{\"prompt\":[7],\n\"routing\":\t" + mine + "\n}"},
	} {
		if tc.want == "" {
			tc.want = tc.sent
		}
		for _, chunked := range []bool{false, true} {
			var body io.Reader = strings.NewReader(tc.sent)
			if chunked {
				body = onlyReader{body}
			}
			resp, b := do(t, ts, http.MethodPost, CompletionsPath, body, withHeader("Content-Type", "application/json"))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: %d %s", tc.sent, resp.StatusCode, b)
			}
			s := <-got
			if string(s.body) != tc.want {
				t.Errorf("engine got\n%s\nwant\n%s", s.body, tc.want)
			}
			if s.header.Get(PrefillNameHeader) != engine || s.header.Get("Content-Length") != strconv.Itoa(len(tc.want)) {
				t.Errorf("engine headers %v", s.header)
			}
		}
	}
}

// TestRoutingHeadersOptIn covers issue 10 item 6: the decision comes
// back to the client only with ExposeRoutingHeaders.
func TestRoutingHeadersOptIn(t *testing.T) {
	engine, got := recordingEngine(t)
	router := routerFor(t, engine)
	names := []string{PrefillNameHeader, DecodeNameHeader, PolicyHeader, DecisionMicrosHeader, HitRatioHeader}
	for _, expose := range []bool{false, true} {
		ts := startPublicServer(t, Options{Router: router, ExposeRoutingHeaders: expose})
		resp, b := do(t, ts, http.MethodPost, CompletionsPath, strings.NewReader(`{"prompt":[1,2]}`))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		<-got
		for _, k := range names {
			if present := resp.Header.Get(k) != ""; present != (expose && k != DecodeNameHeader) {
				t.Errorf("expose %v: header %s = %q", expose, k, resp.Header.Get(k))
			}
		}
		if expose && resp.Header.Get(PrefillNameHeader) != engine {
			t.Errorf("X-Prefill-Name %q, want %s", resp.Header.Get(PrefillNameHeader), engine)
		}
	}
}

// TestBadGatewayIsGeneric covers issue 10 item 6: an engine that drops
// the connection gives the client a 502 that names no engine, and the
// log the detail.
func TestBadGatewayIsGeneric(t *testing.T) {
	engine := startEngine(t, func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	})
	var logs testlog.Buffer
	ts := routedServer(t, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)), ExposeRoutingHeaders: false}, engine)
	resp, b := do(t, ts, http.MethodPost, CompletionsPath, strings.NewReader(`{"prompt":[1,2]}`))
	checkError(t, resp, b, http.StatusBadGateway, "upstream engine failed")
	host, _, _ := net.SplitHostPort(engine)
	if bytes.Contains(b, []byte(host)) || len(resp.Header.Values(PrefillNameHeader)) > 0 {
		t.Errorf("the 502 shows the engine: %s %v", b, resp.Header)
	}
	if l := logs.String(); !strings.Contains(l, "engine request failed") || !strings.Contains(l, engine) {
		t.Errorf("log does not name the engine: %s", l)
	}
}

// TestInferenceBodyLimits covers issue 10 item 1: a body over
// MaxRequestBodyBytes is refused with 413 naming the limit, before it is
// read when its length is declared; prompt ids over MaxTokenIDs get 400
// naming that limit.
func TestInferenceBodyLimits(t *testing.T) {
	engine, got := recordingEngine(t)
	ts := routedServer(t, Options{MaxRequestBodyBytes: 4096, MaxTokenIDs: 100}, engine)
	big := `{"prompt":[` + strings.Repeat("1,", 3000) + `1]}`
	for _, body := range []io.Reader{strings.NewReader(big), onlyReader{strings.NewReader(big)}} {
		resp, b := do(t, ts, http.MethodPost, CompletionsPath, body)
		if resp.StatusCode != http.StatusRequestEntityTooLarge && resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
	}
	resp, b := do(t, ts, http.MethodPost, CompletionsPath, strings.NewReader(`{"prompt":"`+strings.Repeat("a", 5000)+`"}`))
	checkError(t, resp, b, http.StatusRequestEntityTooLarge, "request body exceeds 4096 bytes")
	resp, b = do(t, ts, http.MethodPost, CompletionsPath, onlyReader{strings.NewReader(`{"prompt":"` + strings.Repeat("a", 5000) + `"}`)})
	checkError(t, resp, b, http.StatusRequestEntityTooLarge, "request body exceeds 4096 bytes")
	resp, b = do(t, ts, http.MethodPost, CompletionsPath, strings.NewReader(`{"prompt":[`+strings.Repeat("1,", 100)+`1]}`))
	checkError(t, resp, b, http.StatusBadRequest, "prompt: more than 100 ids")
	resp, b = do(t, ts, http.MethodPost, CompletionsPath, strings.NewReader(`{"prompt":[`+strings.Repeat("1,", 99)+`1]}`))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("100 ids: %d %s", resp.StatusCode, b)
	}
	<-got
}

// TestInflightBudget covers issue 10 item 1: while the request bytes in
// flight fill MaxInflightRequestBytes, another request is refused with
// 503 and Retry-After; once they are released it is served.
func TestInflightBudget(t *testing.T) {
	engine, got := recordingEngine(t)
	srv := New(Options{MaxRequestBodyBytes: 2000, MaxInflightRequestBytes: 2001, Router: routerFor(t, engine)})
	srv.SetReady(true)
	ts := serveH1(t, srv.Handler(), HTTP1Options{})
	// A body of unknown length that stops short of its end holds the
	// budget for what it has sent while it is read. It sends 1,990 bytes,
	// more than the budget leaves for a 14-byte body whatever buffer it is
	// read into.
	pr, pw := io.Pipe()
	first := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, ts.URL+CompletionsPath, pr)
		resp, err := ts.Client().Do(req)
		if err != nil {
			first <- 0
			return
		}
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	stalled := `{"prompt":[` + strings.Repeat("1,", 989) + "1"
	if _, err := io.WriteString(pw, stalled); err != nil {
		t.Fatal(err)
	}
	// Another request sent before the body is being read could take
	// budget the stalled one then finds missing: wait until it holds.
	for deadline := time.Now().Add(10 * time.Second); srv.proxy.budget.Used() < int64(len(stalled)); {
		select {
		case code := <-first:
			t.Fatalf("the request meant to hold the budget ended, with %d", code)
		case <-time.After(time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stalled request holds %d bytes of the budget", srv.proxy.budget.Used())
		}
	}
	resp, b := do(t, ts, http.MethodPost, CompletionsPath, strings.NewReader(`{"prompt":[4]}`))
	checkError(t, resp, b, http.StatusServiceUnavailable, "too many request bytes in flight")
	if resp.Header.Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	if _, err := io.WriteString(pw, `]}`); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if code := <-first; code != http.StatusOK {
		t.Fatalf("the request holding the budget: %d", code)
	}
	<-got
	resp, b = do(t, ts, http.MethodPost, CompletionsPath, strings.NewReader(`{"prompt":[4]}`))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("after the budget was released: %d %s", resp.StatusCode, b)
	}
	<-got
}

// textTokenizer gives the request path the real tokenizer, as the
// command does; started, when not nil, hears of each Encode.
type textTokenizer struct {
	t       *tokenizer.Tokenizer
	started chan struct{}
}

func (c textTokenizer) Encode(ctx context.Context, text string, dst []uint32) ([]uint32, error) {
	if c.started != nil {
		c.started <- struct{}{}
	}
	return c.t.EncodeContext(ctx, text, dst)
}

func (c textTokenizer) EncodeChat(ctx context.Context, msgs []ChatMessage, dst []uint32) ([]uint32, error) {
	tm := make([]tokenizer.Message, len(msgs))
	for i, m := range msgs {
		tm[i] = tokenizer.Message{Role: m.Role, Content: m.Content}
	}
	return c.t.EncodeChatContext(ctx, tm, dst)
}

func loadTokenizer(t *testing.T) textTokenizer {
	t.Helper()
	tok, err := tokenizer.Load("../tokenizer/testdata/qwen2like")
	if err != nil {
		t.Fatal(err)
	}
	return textTokenizer{t: tok}
}

// TestPromptTextLimit covers issue 10 item 1: with a tokenizer, prompt
// text and chat content over MaxPromptTextBytes are refused with 413
// naming the limit before any tokenizing; text within it is tokenized and
// routed.
func TestPromptTextLimit(t *testing.T) {
	engine, got := recordingEngine(t)
	ts := routedServer(t, Options{Tokenizer: loadTokenizer(t), MaxPromptTextBytes: 100}, engine)
	resp, b := do(t, ts, http.MethodPost, CompletionsPath, strings.NewReader(`{"prompt":"`+strings.Repeat("a ", 51)+`"}`))
	checkError(t, resp, b, http.StatusRequestEntityTooLarge, "prompt: text exceeds 100 bytes")
	resp, b = do(t, ts, http.MethodPost, ChatCompletionsPath, strings.NewReader(
		`{"messages":[{"role":"system","content":"`+strings.Repeat("a", 60)+`"},{"role":"user","content":"`+strings.Repeat("b", 40)+`"}]}`))
	checkError(t, resp, b, http.StatusRequestEntityTooLarge, "messages: text exceeds 100 bytes")
	resp, b = do(t, ts, http.MethodPost, ChatCompletionsPath, strings.NewReader(`{"messages":[{"role":"user","content":"hello there"}]}`))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("chat within the limit: %d %s", resp.StatusCode, b)
	}
	<-got
}

// TestTokenizingStopsWhenClientGoes covers issue 10 item 1: a prompt
// that takes seconds to tokenize (2 MiB of spaces, one word) stops being
// tokenized soon after its client goes away, and nothing is sent on.
func TestTokenizingStopsWhenClientGoes(t *testing.T) {
	var engineCalls atomic.Int32
	engine := startEngine(t, func(w http.ResponseWriter, r *http.Request) { engineCalls.Add(1) })
	var logs testlog.Buffer
	tok := loadTokenizer(t)
	tok.started = make(chan struct{}, 1)
	s := New(Options{Router: routerFor(t, engine), Tokenizer: tok, MaxPromptTextBytes: 4 << 20,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	s.SetReady(true)
	returned := make(chan time.Time, 1)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.Handler().ServeHTTP(w, r)
		returned <- time.Now()
	}))
	t.Cleanup(ts.Close)

	ctx, cancel := context.WithCancel(t.Context())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+CompletionsPath,
		strings.NewReader(`{"prompt":"`+strings.Repeat(" ", 2<<20)+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		resp, err := ts.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	select {
	case <-tok.started:
	case <-time.After(30 * time.Second):
		t.Fatal("tokenizing did not start within 30 s")
	}
	time.Sleep(50 * time.Millisecond)
	cancel()
	cancelled := time.Now()
	if err := <-done; err == nil {
		t.Fatal("the request finished before its client went away; the prompt is too cheap to show anything")
	}
	select {
	case at := <-returned:
		took := at.Sub(cancelled)
		t.Logf("the handler returned %v after the client went away", took.Round(time.Millisecond))
		// What shows that tokenizing stopped early rather than ran to its
		// end is the tokenizer's answer, logged; the time is only a
		// sanity bound, far above the few hundred ms it takes.
		if !strings.Contains(logs.String(), "client went away while its prompt was tokenized") {
			t.Errorf("tokenizing was not abandoned; log: %s", logs.String())
		}
		if took > 10*time.Second {
			t.Errorf("the handler went on for %v after the client went away", took)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the handler did not return within 30 s of the client going away")
	}
	if n := engineCalls.Load(); n != 0 {
		t.Errorf("the abandoned request reached the engine %d times", n)
	}
}

// TestRetryOfUnwrittenRequest covers issue 13's 502s on reused
// connections: an engine that closes a kept-alive connection while kvcar
// is still writing a request on it (as at the end of its idle timeout) has
// not got the request, so kvcar sends it again on a new connection and the
// client gets the answer.
func TestRetryOfUnwrittenRequest(t *testing.T) {
	e := startDroppingEngine(t)
	ts := routedServer(t, Options{}, e.addr)
	resp, b := do(t, ts, http.MethodPost, CompletionsPath, strings.NewReader(`{"prompt":[1]}`))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("first request: %d %s", resp.StatusCode, b)
	}
	// Larger than what the socket buffers hold, so that the write is
	// still going on when the engine drops the connection.
	big := `{"prompt":[1,2],"pad":"` + strings.Repeat("x", 12<<20) + `"}`
	resp, b = do(t, ts, http.MethodPost, CompletionsPath, strings.NewReader(big))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("request on the dropped connection: %d %s", resp.StatusCode, b)
	}
	if n := e.heads.Load(); n != 3 {
		t.Errorf("the engine saw %d request heads, want 3: one served, one dropped, its retry served", n)
	}
	if n := e.full.Load(); n != 2 {
		t.Errorf("the engine read %d whole bodies, want 2", n)
	}
}

// droppingEngine serves HTTP/1.1 by hand: on its first connection it
// answers the first request and, on the second, drops the connection with
// a reset once it has read the request's head; every other request is
// answered.
type droppingEngine struct {
	addr        string
	heads, full atomic.Int32
}

func startDroppingEngine(t *testing.T) *droppingEngine {
	e := &droppingEngine{}
	e.addr = serveTCP(t, func(conn net.Conn, n int) { e.serve(conn, n == 0) })
	return e
}

func (e *droppingEngine) serve(conn net.Conn, drop bool) {
	defer conn.Close()
	br := bufio.NewReader(conn)
	for n := 0; ; n++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		e.heads.Add(1)
		if drop && n == 1 {
			_ = conn.(*net.TCPConn).SetLinger(0)
			return
		}
		if _, err := io.Copy(io.Discard, req.Body); err != nil {
			return
		}
		e.full.Add(1)
		const answer = `{"choices":[{"text":"ok"}]}`
		if _, err := io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "+
			strconv.Itoa(len(answer))+"\r\n\r\n"+answer); err != nil {
			return
		}
	}
}

// TestAnswerDoesNotHoldBudget: the request bytes are given back once
// the engine has the whole body, so a long streamed answer does not hold
// them and other requests go on being served meanwhile.
func TestAnswerDoesNotHoldBudget(t *testing.T) {
	hold := make(chan struct{})
	var streams atomic.Int32
	engine := startEngine(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		streaming := bytes.Contains(b, []byte(`"stream":true`))
		if streaming {
			// Counted before the first chunk, which the test waits for.
			streams.Add(1)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {}\n\n")
		_ = http.NewResponseController(w).Flush()
		if streaming {
			select {
			case <-hold:
			case <-r.Context().Done():
			}
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
	ts := routedServer(t, Options{MaxRequestBodyBytes: 2000, MaxInflightRequestBytes: 2001}, engine)
	resp, err := ts.Client().Post(ts.URL+CompletionsPath, "application/json", strings.NewReader(`{"prompt":[1],"stream":true,"pad":"`+strings.Repeat("x", 1900)+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "data: {}\n" || streams.Load() != 1 {
		t.Fatalf("first chunk %q, %v", line, err)
	}
	// The streaming request's bytes are given back once the transport is
	// done with its body, which may be just after the first chunk arrives.
	small := func() (*http.Response, []byte) {
		return do(t, ts, http.MethodPost, CompletionsPath, strings.NewReader(`{"prompt":[2],"pad":"`+strings.Repeat("y", 1900)+`"}`))
	}
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if r, _ := small(); r.StatusCode == http.StatusOK || time.Now().After(deadline) {
			break
		}
	}
	for i := range 3 {
		r, b := small()
		if r.StatusCode != http.StatusOK {
			t.Fatalf("request %d while an answer streams: %d %s", i, r.StatusCode, b)
		}
	}
	close(hold)
	if rest, err := io.ReadAll(br); err != nil || string(rest) != "\ndata: [DONE]\n\n" {
		t.Fatalf("end of the stream %q, %v", rest, err)
	}
}

// TestAnswerOfKnownLengthKeepsItsLength: an engine's answer with a
// Content-Length goes to the client with that length, not re-chunked
// (one write for a small answer, issue 13), and whole.
func TestAnswerOfKnownLengthKeepsItsLength(t *testing.T) {
	engine, got := recordingEngine(t)
	ts := routedServer(t, Options{}, engine)
	const want = `{"choices":[{"text":"ok"}]}`
	resp, b := do(t, ts, http.MethodPost, CompletionsPath, strings.NewReader(`{"prompt":[1,2]}`))
	<-got
	if resp.StatusCode != http.StatusOK || string(b) != want {
		t.Fatalf("%d %q", resp.StatusCode, b)
	}
	if resp.ContentLength != int64(len(want)) || len(resp.TransferEncoding) != 0 {
		t.Fatalf("answer relayed with length %d, transfer encoding %v; want length %d, not chunked",
			resp.ContentLength, resp.TransferEncoding, len(want))
	}
}

// TestEngineClosedIdleConnectionIsNotUsed covers issue 13's 502s from
// the keep-alive race over real TCP: an engine whose idle timeout is
// shorter than kvcar's closes a kept connection; the next request goes
// on a new connection instead of failing on the closed one.
func TestEngineClosedIdleConnectionIsNotUsed(t *testing.T) {
	var conns atomic.Int32
	e := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"text":"ok"}]}`)
	}))
	e.Config.IdleTimeout = 20 * time.Millisecond
	e.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	e.Start()
	t.Cleanup(e.Close)
	ts := routedServer(t, Options{}, strings.TrimPrefix(e.URL, "http://"))
	for i := range 3 {
		resp, b := do(t, ts, http.MethodPost, CompletionsPath, strings.NewReader(`{"prompt":[1,2,3]}`))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d after the engine closed the idle connection: %d %s", i, resp.StatusCode, b)
		}
		// Long past the engine's idle timeout: its FIN has arrived.
		time.Sleep(100 * time.Millisecond)
	}
	if n := conns.Load(); n != 3 {
		t.Errorf("the engine accepted %d connections, want 3: one per request, each closed idle", n)
	}
}

// holdFirst is a listener whose first connection is taken and never
// read, as by an engine that hangs; the later ones are served.
type holdFirst struct {
	net.Listener
	mu   sync.Mutex
	held []net.Conn
}

func (l *holdFirst) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		l.mu.Lock()
		first := len(l.held) == 0
		if first {
			l.held = append(l.held, c)
		}
		l.mu.Unlock()
		if !first {
			return c, nil
		}
	}
}

// TestClientGoneFreesRequestOnStuckEngine: a client that goes away while
// kvcar is still writing its body to an engine that does not read ends
// kvcar's request at once (its in-flight bytes go back), instead of
// leaving it blocked on the engine.
func TestClientGoneFreesRequestOnStuckEngine(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hl := &holdFirst{Listener: ln}
	e := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, `{"choices":[{"text":"ok"}]}`)
	})}
	go func() { _ = e.Serve(hl) }()
	ts := routedServer(t, Options{MaxInflightRequestBytes: 20 << 20}, ln.Addr().String())
	// Registered after kvcar's server, so run before its Close, which
	// waits for a request still blocked on the engine.
	t.Cleanup(func() {
		e.Close()
		hl.mu.Lock()
		for _, c := range hl.held {
			c.Close()
		}
		hl.mu.Unlock()
	})
	body := func(n int) string { return `{"prompt":[1],"pad":"` + strings.Repeat("x", n) + `"}` }

	ctx, cancel := context.WithCancel(t.Context())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+CompletionsPath, strings.NewReader(body(14<<20)))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := ts.Client().Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	// Until kvcar has read the body and is blocked writing it to the
	// engine that does not read: the engine holds the connection and the
	// write has had time to fill the socket. A fixed wait was not enough
	// under -race on loaded cores, and then the next request got the held
	// connection and waited forever.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		hl.mu.Lock()
		held := len(hl.held)
		hl.mu.Unlock()
		if held > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("kvcar did not connect to the engine within 20 s")
		}
	}
	time.Sleep(200 * time.Millisecond)
	cancel()
	<-done
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, b := do(t, ts, http.MethodPost, CompletionsPath, strings.NewReader(body(8<<20)))
		if resp.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("3 s after its client went away the stuck request still holds its bytes: %d %s", resp.StatusCode, b)
		}
	}
}
