package server

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// scriptedEngine is a real TCP engine on loopback that reads each HTTP
// request kvcar sends (parsed by net/http) and answers it with the raw
// bytes answer returns for the request's number (from 0, over all
// connections), so
// that tests can send answers no well-behaved server would. A connection
// is closed after an answer when closeAfter says so. conns counts the
// connections kvcar opened.
type scriptedEngine struct {
	addr  string
	conns atomic.Int32
}

func startScriptedEngine(t *testing.T, answer func(n int) (raw string, closeAfter bool)) *scriptedEngine {
	t.Helper()
	e := &scriptedEngine{}
	var requests atomic.Int32
	e.addr = serveTCP(t, func(c net.Conn, _ int) {
		e.conns.Add(1)
		defer c.Close()
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			raw, closeAfter := answer(int(requests.Add(1) - 1))
			if _, err := io.WriteString(c, raw); err != nil || closeAfter {
				return
			}
		}
	})
	return e
}

// TestEngineAnswerForms: kvcar reads engines' answers itself. Each form
// an HTTP/1.1 engine may send is relayed with its status, body,
// Content-Type and Cache-Control (no other engine header), and the
// connection is used again exactly when the answer left it reusable;
// answers that are not HTTP give the client 502, without the details.
func TestEngineAnswerForms(t *testing.T) {
	for _, tc := range []struct {
		name       string
		raw        string
		closeAfter bool
		status     int
		body       string
		ctype      string
		reused     bool
	}{
		{name: "length", raw: "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nCache-Control: no-store\r\nSet-Cookie: a=b\r\nContent-Length: 7\r\n\r\n{\"a\":1}",
			status: 200, body: `{"a":1}`, ctype: "application/json", reused: true},
		{name: "chunked with trailer", raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n" +
			"6\r\ndata: \r\n3\r\nx\n\n\r\n0\r\nX-Trailer: 1\r\n\r\n",
			status: 200, body: "data: x\n\n", ctype: "text/event-stream", reused: true},
		{name: "chunked and length", raw: "HTTP/1.1 200 OK\r\nContent-Length: 99\r\nTransfer-Encoding: Chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
			status: 200, body: "ok", reused: true},
		{name: "informational first", raw: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok",
			status: 201, body: "ok", reused: true},
		{name: "error status", raw: "HTTP/1.1 400 Bad Request\r\nContent-Length: 3\r\n\r\nbad", status: 400, body: "bad", reused: true},
		{name: "no content", raw: "HTTP/1.1 204 No Content\r\n\r\n", status: 204, reused: true},
		{name: "connection close", raw: "HTTP/1.1 200 OK\r\nConnection: keep-alive, close\r\nContent-Length: 2\r\n\r\nok",
			closeAfter: true, status: 200, body: "ok"},
		{name: "HTTP/1.0 until close", raw: "HTTP/1.0 200 OK\r\n\r\nto the end", closeAfter: true, status: 200, body: "to the end"},
		{name: "HTTP/1.0 keep-alive", raw: "HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 2\r\n\r\nok",
			status: 200, body: "ok", reused: true},
		{name: "bare LF", raw: "HTTP/1.1 200 OK\nContent-Length: 2\n\nok", status: 200, body: "ok", reused: true},
		{name: "not HTTP", raw: "SSH-2.0-OpenSSH\r\n\r\n", closeAfter: true, status: 502},
		{name: "bad code", raw: "HTTP/1.1 2x0 OK\r\n\r\n", closeAfter: true, status: 502},
		{name: "code below 100", raw: "HTTP/1.1 099 Odd\r\n\r\n", closeAfter: true, status: 502},
		{name: "conflicting lengths", raw: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
			closeAfter: true, status: 502},
		{name: "signed length", raw: "HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok", closeAfter: true, status: 502},
		{name: "gzip encoding", raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", closeAfter: true, status: 502},
		{name: "space in name", raw: "HTTP/1.1 200 OK\r\nContent Length: 2\r\n\r\nok", closeAfter: true, status: 502},
		{name: "folded line", raw: "HTTP/1.1 200 OK\r\nX-A: 1\r\n b\r\n\r\n", closeAfter: true, status: 502},
		{name: "upgrade", raw: "HTTP/1.1 101 Switching Protocols\r\n\r\n", closeAfter: true, status: 502},
		{name: "endless informational", raw: strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n", 9), closeAfter: true, status: 502},
		{name: "too many header lines", raw: "HTTP/1.1 200 OK\r\n" + strings.Repeat("X-A: 1\r\n", maxAnswerHeadLines+1) + "\r\n",
			closeAfter: true, status: 502},
		{name: "line too long", raw: "HTTP/1.1 200 OK\r\nX-A: " + strings.Repeat("a", 5000) + "\r\n\r\n", closeAfter: true, status: 502},
		{name: "closed before the head ends", raw: "HTTP/1.1 200 OK\r\nContent-Le", closeAfter: true, status: 502},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startScriptedEngine(t, func(int) (string, bool) { return tc.raw, tc.closeAfter })
			ts := routedServer(t, Options{}, e.addr)
			for i := range 2 {
				resp, b := do(t, ts, http.MethodPost, CompletionsPath, strings.NewReader(`{"prompt":[1,2]}`))
				if resp.StatusCode != tc.status {
					t.Fatalf("request %d: status %d %q, want %d", i, resp.StatusCode, b, tc.status)
				}
				if tc.status == http.StatusBadGateway {
					if !strings.Contains(string(b), "upstream engine failed") || strings.Contains(string(b), e.addr) {
						t.Fatalf("502 body %q: want the generic message only", b)
					}
					continue
				}
				if string(b) != tc.body {
					t.Fatalf("request %d: body %q, want %q", i, b, tc.body)
				}
				if got := resp.Header.Get("Content-Type"); tc.ctype != "" && got != tc.ctype {
					t.Fatalf("Content-Type %q, want %q", got, tc.ctype)
				}
				if resp.Header.Get("Set-Cookie") != "" || resp.Header.Get("X-Trailer") != "" {
					t.Fatalf("an engine header other than Content-Type and Cache-Control was relayed: %v", resp.Header)
				}
				if strings.Contains(tc.raw, "no-store") && resp.Header.Get("Cache-Control") != "no-store" {
					t.Fatalf("Cache-Control %q, want no-store", resp.Header.Get("Cache-Control"))
				}
			}
			want := int32(2)
			if tc.reused {
				want = 1
			}
			if got := e.conns.Load(); got != want {
				t.Fatalf("kvcar opened %d connections for two requests, want %d", got, want)
			}
		})
	}
}

// TestEngineAnswerCutShort: an answer whose body ends before its
// Content-Length is not relayed as whole (the client sees the answer
// fail), and its connection is not used again.
func TestEngineAnswerCutShort(t *testing.T) {
	e := startScriptedEngine(t, func(n int) (string, bool) {
		if n == 0 {
			return "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this", true
		}
		return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false
	})
	ts := routedServer(t, Options{}, e.addr)
	// The client may see the failure as soon as the head or only in the
	// body: either way it must not get a whole answer.
	if resp, err := ts.Client().Post(ts.URL+CompletionsPath, "application/json", strings.NewReader(`{"prompt":[1]}`)); err == nil {
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode == 200 {
			t.Fatalf("a cut-off answer was relayed as whole: %q", b)
		}
	}
	// kvcar closes the client's connection of the failed answer.
	ts.Client().CloseIdleConnections()
	for range 2 {
		resp, b := do(t, ts, http.MethodPost, CompletionsPath, strings.NewReader(`{"prompt":[1]}`))
		if resp.StatusCode != 200 || string(b) != "ok" {
			t.Fatalf("after a cut-off answer: %d %q", resp.StatusCode, b)
		}
	}
	if got := e.conns.Load(); got != 2 {
		t.Fatalf("kvcar opened %d connections, want 2: the cut one must not be used again", got)
	}
}
