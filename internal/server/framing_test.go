package server

// Framing tests of kvcar's HTTP/1.1 server (h1head.go, h1serve.go) and
// of its engine client (engineclient.go, answer.go), R-API-5: each input
// is sent as raw bytes over real TCP; where useful the same bytes go to
// net/http's server and the two verdicts are compared, since a request
// kvcar serves that net/http does not see, or a body kvcar frames
// otherwise, is a request a proxy in front of kvcar could smuggle.

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// seenReq is one request as a handler saw it.
type seenReq struct {
	method, path, body string
	bodyErr            bool
}

func (s seenReq) String() string {
	e := ""
	if s.bodyErr {
		e = " (body error)"
	}
	return fmt.Sprintf("%s %s body=%q%s", s.method, s.path, s.body, e)
}

// recorder is a handler that reads each request's body whole and records
// what it saw; it answers 200 with the path, or 400 when the body could
// not be read.
type recorder struct {
	mu   sync.Mutex
	seen []seenReq
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	rec.mu.Lock()
	rec.seen = append(rec.seen, seenReq{method: r.Method, path: r.URL.Path, body: string(b), bodyErr: err != nil})
	rec.mu.Unlock()
	if err != nil {
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	_, _ = io.WriteString(w, "path="+r.URL.Path)
}

func (rec *recorder) take() []seenReq {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	s := rec.seen
	rec.seen = nil
	return s
}

// exchange writes raw on a new connection to addr and reads until the
// server closes the connection or it stays quiet for quiet; it returns
// the status of each answer, as net/http parses them, and every byte
// read.
func exchange(t *testing.T, addr, raw string, quiet time.Duration) (statuses []int, read string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	var all bytes.Buffer
	buf := make([]byte, 64<<10)
	for {
		_ = c.SetReadDeadline(time.Now().Add(quiet))
		n, err := c.Read(buf)
		all.Write(buf[:n])
		if err != nil {
			break
		}
	}
	br := bufio.NewReader(bytes.NewReader(all.Bytes()))
	for {
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodGet})
		if err != nil {
			return statuses, all.String()
		}
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		statuses = append(statuses, resp.StatusCode)
	}
}

// twoServers serves one recorder by kvcar's HTTP1Server and another by
// net/http's server, both on loopback.
func twoServers(t *testing.T, o HTTP1Options) (kv string, kvRec *recorder, std string, stdRec *recorder) {
	t.Helper()
	kvRec, stdRec = &recorder{}, &recorder{}
	ts := serveH1(t, kvRec, o)
	ns := httptest.NewUnstartedServer(stdRec)
	ns.Config.ErrorLog = nil
	ns.Start()
	t.Cleanup(ns.Close)
	return ts.Listener.Addr().String(), kvRec, ns.Listener.Addr().String(), stdRec
}

// TestOptionsStarBodyIsSkipped: the body of "OPTIONS *", which kvcar
// answers itself, is framed and skipped like any other (RFC 9112 6.3:
// Content-Length, or the chunked coding, gives the body's length
// whatever the method and target), as net/http does; a request sent as
// that body is never served.
func TestOptionsStarBodyIsSkipped(t *testing.T) {
	kv, kvRec, std, stdRec := twoServers(t, HTTP1Options{})
	smuggled := "GET /smuggled HTTP/1.1\r\nHost: kvcar\r\n\r\n"
	chunk := strconv.FormatInt(int64(len(smuggled)), 16) + "\r\n" + smuggled + "\r\n0\r\n\r\n"
	for _, raw := range []string{
		// OPTIONS * HTTP/1.1 / Content-Length: 39 / body = a whole request.
		"OPTIONS * HTTP/1.1\r\nHost: kvcar\r\nContent-Length: " + strconv.Itoa(len(smuggled)) + "\r\n\r\n" + smuggled,
		// The same as the second request of a connection.
		"GET /first HTTP/1.1\r\nHost: kvcar\r\n\r\n" +
			"OPTIONS * HTTP/1.1\r\nHost: kvcar\r\nContent-Length: " + strconv.Itoa(len(smuggled)) + "\r\n\r\n" + smuggled,
		// Chunked: the chunk-size line is taken for a request line.
		"OPTIONS * HTTP/1.1\r\nHost: kvcar\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk + nextMarker,
	} {
		kvStatus, _ := exchange(t, kv, raw, 300*time.Millisecond)
		stdStatus, _ := exchange(t, std, raw, 300*time.Millisecond)
		kvSeen, stdSeen := kvRec.take(), stdRec.take()
		for _, s := range stdSeen {
			if s.path == "/smuggled" {
				t.Fatalf("net/http served the body as a request too: %v", stdSeen)
			}
		}
		if fmt.Sprint(kvSeen) != fmt.Sprint(stdSeen) || len(kvStatus) != len(stdStatus) {
			t.Errorf("%q:\nkvcar's handler saw %v, answers %v;\nnet/http's saw %v, answers %v",
				raw, kvSeen, kvStatus, stdSeen, stdStatus)
		}
	}
}

// TestOptionsStarBodyReachesNoEngine: through kvcar's public routes, a
// completion sent as the body of OPTIONS * reaches no engine.
func TestOptionsStarBodyReachesNoEngine(t *testing.T) {
	engine, got := recordingEngine(t)
	addr, _ := h1Stack(t, Options{}, HTTP1Options{}, engine)
	hidden := completionRequest(`{"prompt":[6,6,6]}`)
	raw := "OPTIONS * HTTP/1.1\r\nHost: kvcar\r\nContent-Length: " + strconv.Itoa(len(hidden)) + "\r\n\r\n" + hidden
	statuses, _ := exchange(t, addr, raw, 500*time.Millisecond)
	select {
	case s := <-got:
		t.Errorf("%q:\nthe engine got the completion sent as the OPTIONS * body: %q (answers %v)", raw, s.body, statuses)
	default:
	}
	if len(statuses) != 1 || statuses[0] != http.StatusOK {
		t.Errorf("OPTIONS * answered %v, want one 200", statuses)
	}
}

// framingCases are request bytes, each followed on the same write by a
// marker request, GET /next: whatever a server takes of the bytes, the
// marker shows where it thinks the next request starts.
var framingCases = []struct{ name, raw string }{
	{"cl", "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc"},
	{"cl repeated same", "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc"},
	{"cl repeated differ", "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"},
	{"cl list same", "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3, 3\r\n\r\nabc"},
	{"cl list differ", "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3, 4\r\n\r\nabcd"},
	{"cl leading zeros", "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 003\r\n\r\nabc"},
	{"cl plus", "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: +3\r\n\r\nabc"},
	{"cl negative", "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: -3\r\n\r\nabc"},
	{"cl hex", "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 0x3\r\n\r\nabc"},
	{"cl empty", "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: \r\n\r\nabc"},
	{"cl overflow", "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999\r\n\r\nabc"},
	{"cl 19 digits", "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 0000000000000000003\r\n\r\nabc"},
	{"cl trailing ws", "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3 \t\r\n\r\nabc"},
	{"cl space in name", "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length : 3\r\n\r\nabc"},
	{"cl tab in name", "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length\t: 3\r\n\r\nabc"},
	{"cl folded", "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length:\r\n 3\r\n\r\nabc"},
	{"cl underscore", "POST /a HTTP/1.1\r\nHost: h\r\nContent_Length: 3\r\n\r\nabc"},
	{"cl NUL", "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\x00\r\n\r\nabc"},
	{"cl CR in value", "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r4\r\n\r\nabcd"},
	{"cl and te", "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"},
	{"te and cl", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n3\r\nabc\r\n0\r\n\r\n"},
	{"te chunked", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"},
	{"te Chunked", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: Chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"},
	{"te space chunked", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding:   chunked  \r\n\r\n3\r\nabc\r\n0\r\n\r\n"},
	{"te gzip, chunked", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"},
	{"te chunked, gzip", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, gzip\r\n\r\n3\r\nabc\r\n0\r\n\r\n"},
	{"te chunked, chunked", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"},
	{"te identity", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: identity\r\n\r\n3\r\nabc\r\n0\r\n\r\n"},
	{"te empty", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: \r\n\r\n3\r\nabc\r\n0\r\n\r\n"},
	{"te xchunked", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: xchunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"},
	{"te chunked twice", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"},
	{"te space in name", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding : chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"},
	{"te folded", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding:\r\n chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"},
	{"te vertical tab", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: \x0bchunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"},
	{"te in 1.0", "POST /a HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"},
	{"chunk ext", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\n\r\n"},
	{"chunk ext quoted", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3;x=\"a\r\nb\"\r\nabc\r\n0\r\n\r\n"},
	{"chunk size upper hex", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nA\r\n0123456789\r\n0\r\n\r\n"},
	{"chunk size leading zeros", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0003\r\nabc\r\n0\r\n\r\n"},
	{"chunk size leading space", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n 3\r\nabc\r\n0\r\n\r\n"},
	{"chunk size trailing space", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3 \r\nabc\r\n0\r\n\r\n"},
	{"chunk size 0x", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0x3\r\nabc\r\n0\r\n\r\n"},
	{"chunk size negative", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n-3\r\nabc\r\n0\r\n\r\n"},
	{"chunk size plus", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n+3\r\nabc\r\n0\r\n\r\n"},
	{"chunk size overflow", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000003\r\nabc\r\n0\r\n\r\n"},
	{"chunk bare LF size", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\nabc\r\n0\r\n\r\n"},
	{"chunk bare LF data", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\n0\r\n\r\n"},
	{"chunk missing CRLF", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc0\r\n\r\n"},
	{"chunk data too long", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcd\r\n0\r\n\r\n"},
	{"chunk bare CR", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\rabc\r\n0\r\n\r\n"},
	{"last chunk bare LF", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\n\n"},
	{"last chunk 000", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n000\r\n\r\n"},
	{"last chunk ext", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0;x\r\n\r\n"},
	{"trailer field", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n"},
	{"trailer space name", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX T: 1\r\n\r\n"},
	{"obs-fold", "POST /a HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n 2\r\nContent-Length: 3\r\n\r\nabc"},
	{"header NUL", "POST /a HTTP/1.1\r\nHost: h\r\nX-A: 1\x002\r\nContent-Length: 3\r\n\r\nabc"},
	{"header DEL", "POST /a HTTP/1.1\r\nHost: h\r\nX-A: 1\x7f2\r\nContent-Length: 3\r\n\r\nabc"},
	{"header obs-text", "POST /a HTTP/1.1\r\nHost: h\r\nX-A: caf\xe9\r\nContent-Length: 3\r\n\r\nabc"},
	{"bare LF head", "POST /a HTTP/1.1\nHost: h\nContent-Length: 3\n\nabc"},
	{"bare CR head", "POST /a HTTP/1.1\rHost: h\r\nContent-Length: 3\r\n\r\nabc"},
	{"extra space in request line", "POST  /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc"},
	{"space in target", "POST /a b HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc"},
	{"trailing space request line", "POST /a HTTP/1.1 \r\nHost: h\r\nContent-Length: 3\r\n\r\nabc"},
	{"tab in request line", "POST\t/a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc"},
	{"lower version", "POST /a http/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc"},
	{"absolute form", "POST http://h/a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc"},
	{"no host", "POST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"},
	{"two hosts", "POST /a HTTP/1.1\r\nHost: h\r\nHost: i\r\nContent-Length: 3\r\n\r\nabc"},
	{"http 1.0 keep-alive", "POST /a HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 3\r\n\r\nabc"},
	{"leading CRLF", "\r\nPOST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc"},
	{"GET with body", "GET /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc"},
	{"expect continue", "POST /a HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc"},
	{"expect other", "POST /a HTTP/1.1\r\nHost: h\r\nExpect: 100-continuex\r\nContent-Length: 3\r\n\r\nabc"},
}

const nextMarker = "GET /next HTTP/1.1\r\nHost: h\r\n\r\n"

// TestFramingAgreesWithNetHTTP sends each framing case, followed by a
// marker request, to kvcar and to net/http and compares what their
// handlers saw: kvcar's must see no request and no body net/http's did
// not (kvcar may refuse more).
func TestFramingAgreesWithNetHTTP(t *testing.T) {
	kv, kvRec, std, stdRec := twoServers(t, HTTP1Options{})
	var wg sync.WaitGroup
	type result struct {
		kvStatus, stdStatus []int
		kvSeen, stdSeen     []seenReq
	}
	results := make([]result, len(framingCases))
	// One at a time: each server's recorder is shared.
	for i, c := range framingCases {
		raw := c.raw + nextMarker
		var r result
		wg.Go(func() { r.kvStatus, _ = exchange(t, kv, raw, 250*time.Millisecond) })
		wg.Go(func() { r.stdStatus, _ = exchange(t, std, raw, 250*time.Millisecond) })
		wg.Wait()
		r.kvSeen, r.stdSeen = kvRec.take(), stdRec.take()
		results[i] = r
	}
	for i, c := range framingCases {
		r := results[i]
		t.Logf("%-28s kvcar %v %v | net/http %v %v", c.name, r.kvStatus, r.kvSeen, r.stdStatus, r.stdSeen)
		// Every request kvcar's handler took with its body whole must be
		// one net/http's handler took the same way.
		for _, k := range r.kvSeen {
			if k.bodyErr {
				continue
			}
			found := false
			for _, s := range r.stdSeen {
				if s == k {
					found = true
				}
			}
			if !found {
				t.Errorf("%s: kvcar served %v, which net/http did not (net/http saw %v, answered %v; kvcar answered %v)",
					c.name, k, r.stdSeen, r.stdStatus, r.kvStatus)
			}
		}
	}
}

// TestTransferEncodingFoldsASCIIOnly: "chun\u212aed" (a Kelvin sign,
// which Unicode folds to 'k') is not the chunked coding: transfer
// codings are ASCII tokens compared ASCII case-insensitively (RFC 9112
// 7, RFC 9110 5.6.2). net/http answers 501, and so does kvcar, where a
// front proxy that sees no chunked coding would frame the body
// otherwise.
func TestTransferEncodingFoldsASCIIOnly(t *testing.T) {
	kv, kvRec, std, stdRec := twoServers(t, HTTP1Options{})
	raw := "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chun\u212aed\r\n\r\n3\r\nabc\r\n0\r\n\r\n" + nextMarker
	kvStatus, _ := exchange(t, kv, raw, 300*time.Millisecond)
	stdStatus, _ := exchange(t, std, raw, 300*time.Millisecond)
	kvSeen, stdSeen := kvRec.take(), stdRec.take()
	if len(stdSeen) != 0 || len(stdStatus) != 1 || stdStatus[0] != http.StatusNotImplemented {
		t.Fatalf("net/http: saw %v, answered %v; want 501 only", stdSeen, stdStatus)
	}
	if len(kvSeen) != 0 || len(kvStatus) != 1 || kvStatus[0] < 400 {
		t.Errorf("%q:\nkvcar took \"chun\\u212aed\" for chunked: its handler saw %v, answers %v; net/http answered %v",
			raw, kvSeen, kvStatus, stdStatus)
	}
}

// TestTrailerMustBeFieldLines: a chunked body's trailer is field lines
// (RFC 9112 7.1.2: trailer-section = *( field-line CRLF )); a request
// line, a line without a colon, a NUL, a bare CR or a leading space there
// fails the body's read, as in net/http. The first case hides a whole
// request in the trailer, which a front end that ends the body at "0\r\n"
// would take for the next request.
func TestTrailerMustBeFieldLines(t *testing.T) {
	kv, kvRec, std, stdRec := twoServers(t, HTTP1Options{})
	const pre = "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n"
	for _, c := range []struct{ name, trailer string }{
		{"request line", "GET /hidden HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"no colon", "nocolon\r\n\r\n"},
		{"NUL in value", "X-T: a\x00b\r\n\r\n"},
		{"bare CR in value", "X-T: a\rb\r\n\r\n"},
		{"leading space", " x: 1\r\n\r\n"},
	} {
		raw := pre + c.trailer + nextMarker
		exchange(t, kv, raw, 250*time.Millisecond)
		exchange(t, std, raw, 250*time.Millisecond)
		kvSeen, stdSeen := kvRec.take(), stdRec.take()
		if len(stdSeen) != 1 || !stdSeen[0].bodyErr {
			t.Fatalf("%s: net/http saw %v, want the body to fail", c.name, stdSeen)
		}
		if len(kvSeen) == 0 || !kvSeen[0].bodyErr {
			t.Errorf("%s: %q\nkvcar took a malformed trailer: its handler saw %v; net/http's saw %v",
				c.name, raw, kvSeen, stdSeen)
		}
	}
}

// TestManyHeaderFieldsRefusedAtOnce: a head's field lines are bounded
// (maxHeadFields), so that a head of many names, each cheap in bytes,
// costs bounded CPU: 40,000 names in a 400 KB head (within the 1 MiB
// head limit) get a 431 naming the limit at once, where recording them
// all once took seconds. The same bound holds for a chunked body's
// trailer. A head at the limit is served.
func TestManyHeaderFieldsRefusedAtOnce(t *testing.T) {
	kv, _, _, _ := twoServers(t, HTTP1Options{ReadHeaderTimeout: 2 * time.Second})
	head := func(names int) string {
		var b strings.Builder
		b.WriteString("GET /a HTTP/1.1\r\nHost: h\r\nConnection: close\r\n")
		for i := range names {
			fmt.Fprintf(&b, "x%06d:\r\n", i)
		}
		b.WriteString("\r\n")
		return b.String()
	}
	start := time.Now()
	status, read := exchange(t, kv, head(40000), 5*time.Second)
	took := time.Since(start)
	if len(status) != 1 || status[0] != http.StatusRequestHeaderFieldsTooLarge || took > time.Second {
		t.Fatalf("40,000 header fields: answered %v in %v, want 431 within a second", status, took)
	}
	if want := "more than " + strconv.Itoa(maxHeadFields) + " header fields"; !strings.Contains(read, want) {
		t.Errorf("the 431 %q does not say %q", read, want)
	}
	// Two fields (Host, Connection) and maxHeadFields-2 more: the limit.
	if status, _ := exchange(t, kv, head(maxHeadFields-2), time.Second); len(status) != 1 || status[0] != http.StatusOK {
		t.Errorf("a head of %d fields: answered %v, want 200", maxHeadFields, status)
	}
	var tr strings.Builder
	tr.WriteString("POST /a HTTP/1.1\r\nHost: h\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n")
	for i := range maxHeadFields + 1 {
		fmt.Fprintf(&tr, "x%06d:\r\n", i)
	}
	tr.WriteString("\r\n")
	if status, _ := exchange(t, kv, tr.String(), time.Second); len(status) != 1 || status[0] != http.StatusBadRequest {
		t.Errorf("a trailer of %d fields: answered %v, want 400", maxHeadFields+1, status)
	}
}

// TestEngineChunkedAnswerCutIsNotWhole: an engine answer of unknown
// length (chunked) that is cut off, or whose chunking is malformed, does
// not reach the client as a whole answer (RFC 9112 8: an incomplete
// message must be recorded as incomplete): kvcar aborts the client's
// answer, as net/http's ReverseProxy does (http.ErrAbortHandler), and
// counts it as a 502. TestEngineAnswerCutShort asks the same of a
// Content-Length answer.
func TestEngineChunkedAnswerCutIsNotWhole(t *testing.T) {
	for _, tc := range []struct{ name, raw string }{
		{"cut inside a chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nok"},
		{"cut before the last chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n"},
		{"huge chunk cut", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffff\r\nok"},
		{"malformed chunk size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nok\r\n0\r\n\r\n"},
		{"chunk size overflow", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1fffffffffffffffff\r\nok\r\n0\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startScriptedEngine(t, func(int) (string, bool) { return tc.raw, true })
			reg := prometheus.NewRegistry()
			ts := routedServer(t, Options{Metrics: reg}, e.addr)
			defer func() {
				if got := requestCounts(t, reg)["code=502 route=/v1/completions "]; got != 1 {
					t.Errorf("kvcar_http_requests_total{code=502}: %v, want the aborted answer counted; all: %v", got, requestCounts(t, reg))
				}
			}()
			cl := ts.Client()
			cl.Timeout = 5 * time.Second
			resp, err := cl.Post(ts.URL+CompletionsPath, "application/json", strings.NewReader(`{"prompt":[1]}`))
			if err != nil {
				return // failed as it should
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil && resp.StatusCode == http.StatusOK {
				t.Errorf("engine sent %q and closed:\nthe client got a complete 200 answer %q (Content-Length %d, chunked %v)",
					tc.raw, b, resp.ContentLength, resp.TransferEncoding)
			}
		})
	}
}

// TestEngineHTTP10TransferEncodingCloses: the connection of an HTTP/1.0
// answer with Transfer-Encoding is closed after it, even when it asks to
// be kept (RFC 9112 6.1: such a message's framing is faulty, "even if a
// Content-Length is present").
func TestEngineHTTP10TransferEncodingCloses(t *testing.T) {
	for _, raw := range []string{
		"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
		"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 18\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
	} {
		e := startScriptedEngine(t, func(int) (string, bool) { return raw, false })
		ts := routedServer(t, Options{}, e.addr)
		for range 2 {
			do(t, ts, http.MethodPost, CompletionsPath, strings.NewReader(`{"prompt":[1]}`))
		}
		if got := e.conns.Load(); got != 2 {
			t.Errorf("%q: kvcar used %d connection(s) for two requests; the first must be closed after the answer", raw, got)
		}
	}
}

// TestEngineHeaderFoldsASCIIOnly: "Tran\u017ffer-Encoding" (a long s,
// which Unicode folds to 's') is no field name (RFC 9110 5.1: a token),
// and "chun\u212aed" (a Kelvin sign) no chunked coding: net/http's
// ReadResponse refuses both answers, and kvcar answers 502, as to any
// malformed answer.
func TestEngineHeaderFoldsASCIIOnly(t *testing.T) {
	for _, raw := range []string{
		"HTTP/1.1 200 OK\r\nTran\u017ffer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chun\u212aed\r\n\r\n2\r\nok\r\n0\r\n\r\n",
	} {
		if resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(raw)), nil); err == nil {
			_, err = io.ReadAll(resp.Body)
			if err == nil {
				t.Fatalf("%q: net/http reads it too", raw)
			}
		}
		e := startScriptedEngine(t, func(int) (string, bool) { return raw, true })
		ts := routedServer(t, Options{}, e.addr)
		resp, b := do(t, ts, http.MethodPost, CompletionsPath, strings.NewReader(`{"prompt":[1]}`))
		if resp.StatusCode != http.StatusBadGateway {
			t.Errorf("%q: kvcar relayed %d %q, framing the body as chunked; want 502", raw, resp.StatusCode, b)
		}
	}
}

// TestEngineAnswerNoLeak: bytes an engine sends past an
// answer's end (after a Content-Length or chunked body, as the body of a
// 204, 304 or HEAD answer, in the same write or a moment later) never
// become the answer to the next request on the kept connection, and a
// 1xx with a Content-Length is taken as bodiless.
func TestEngineAnswerNoLeak(t *testing.T) {
	const leak = "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nLEAKED"
	const second = "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond"
	for _, tc := range []struct {
		name, first string
		head        bool
	}{
		{name: "extra after length", first: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + leak},
		{name: "extra after chunked", first: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n" + leak},
		{name: "204 with body", first: "HTTP/1.1 204 No Content\r\nContent-Length: 50\r\n\r\n" + leak},
		{name: "304 chunked body", first: "HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + leak},
		{name: "1xx with length", first: "HTTP/1.1 100 Continue\r\nContent-Length: 3\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"},
		{name: "HEAD with length", first: "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n", head: true},
		{name: "HEAD with a body", first: "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n" + leak, head: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startScriptedEngine(t, func(n int) (string, bool) {
				if n == 0 {
					return tc.first, false
				}
				return second, false
			})
			ts := routedServer(t, Options{}, e.addr)
			if tc.head {
				resp, _ := do(t, ts, http.MethodHead, ModelsPath, nil)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("HEAD: %d", resp.StatusCode)
				}
			} else {
				do(t, ts, http.MethodPost, CompletionsPath, strings.NewReader(`{"prompt":[1]}`))
			}
			for i := range 2 {
				if _, b := do(t, ts, http.MethodPost, CompletionsPath, strings.NewReader(`{"prompt":[1]}`)); string(b) != "second" {
					t.Fatalf("request %d after %q got %q", i+2, tc.first, b)
				}
			}
		})
	}
	t.Run("late extra bytes", func(t *testing.T) {
		var requests atomic.Int32
		addr := serveTCP(t, func(c net.Conn, _ int) {
			defer c.Close()
			br := bufio.NewReader(c)
			for {
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				if requests.Add(1) > 1 {
					_, _ = io.WriteString(c, second)
					continue
				}
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				time.Sleep(30 * time.Millisecond)
				_, _ = io.WriteString(c, leak)
			}
		})
		ts := routedServer(t, Options{}, addr)
		do(t, ts, http.MethodPost, CompletionsPath, strings.NewReader(`{"prompt":[1]}`))
		time.Sleep(100 * time.Millisecond)
		if _, b := do(t, ts, http.MethodPost, CompletionsPath, strings.NewReader(`{"prompt":[1]}`)); string(b) != "second" {
			t.Fatalf("second request got %q", b)
		}
	})
}
