package server

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httputil"
	"slices"
	"strconv"
	"strings"
	"time"
)

// h1writer is the http.ResponseWriter of an HTTP1Server's request. The
// head is composed when the handler calls WriteHeader but written with
// the body: an answer that fits outBufSize goes out whole in one write
// with its Content-Length, a longer one, or one flushed before its end,
// in chunks (HTTP/1.1) or up to the connection's end (HTTP/1.0).
type h1writer struct {
	c      *h1conn
	header http.Header
	// Of the request: its method, HTTP/1.minor, whether it asked to
	// close and, in HTTP/1.0, to keep the connection.
	method    string
	minor     int
	reqClose  bool
	keepAlive bool

	status      int
	wroteHeader bool
	headSent    bool
	// bodyAllowed is false for HEAD and for statuses without a body;
	// discard is true for HEAD, whose body writes are dropped.
	bodyAllowed, discard bool
	chunked              bool
	closeAfter           bool
	hasType              bool
	// declared is the handler's Content-Length, -1 when it set none;
	// written is what it wrote.
	declared, written int64
	err               error

	// head is the status line and the handler's fields, without the
	// framing fields and the blank line, which are added when it is sent.
	head []byte
	body *[]byte
	keys []string
	// iov is what send writes: the writer's own, so that a write
	// allocates nothing.
	iov  [][]byte
	size []byte
}

func (w *h1writer) reset(h *reqHead) {
	if w.header == nil {
		w.header = make(http.Header, 8)
	} else {
		clear(w.header)
	}
	w.method, w.minor, w.reqClose, w.keepAlive = h.method, h.minor, h.close, h.keepAlive
	w.status, w.wroteHeader, w.headSent, w.chunked, w.closeAfter, w.hasType = 0, false, false, false, false, false
	w.declared, w.written, w.err = -1, 0, nil
	w.head = w.head[:0]
}

func (w *h1writer) Header() http.Header { return w.header }

// sentStatus is the final status of the answer, 0 while none was set
// (statusReporter).
func (w *h1writer) sentStatus() int { return w.status }

func (w *h1writer) WriteHeader(code int) {
	if w.wroteHeader || w.headSent {
		return
	}
	if code < 100 || code > 999 {
		panic("invalid WriteHeader code " + strconv.Itoa(code))
	}
	if code < 200 {
		// An informational answer goes out at once; the final one follows.
		if code != http.StatusContinue || w.c.body.expect {
			w.head = appendStatusLine(w.head[:0], code)
			w.head = w.appendFields(w.head)
			w.head = append(w.head, "\r\n"...)
			w.writeRaw(w.head)
			w.head = w.head[:0]
			if code == http.StatusContinue {
				w.c.body.expect = false
			}
		}
		return
	}
	w.wroteHeader, w.status = true, code
	w.discard = w.method == http.MethodHead
	w.bodyAllowed = !w.discard && code != http.StatusNoContent && code != http.StatusNotModified
	if v, ok := w.header["Content-Length"]; ok && len(v) > 0 {
		if n, ok := parseLength([]byte(strings.TrimSpace(v[0]))); ok {
			w.declared = n
		}
	}
	if v, ok := w.header["Connection"]; ok {
		for _, s := range v {
			w.closeAfter = w.closeAfter || strings.Contains(strings.ToLower(s), "close")
		}
	}
	_, w.hasType = w.header["Content-Type"]
	w.head = appendStatusLine(w.head[:0], code)
	w.head = w.appendFields(w.head)
	if _, ok := w.header["Date"]; !ok {
		w.head = append(w.head, "Date: "...)
		w.head = append(w.head, w.c.srv.dateNow()...)
		w.head = append(w.head, "\r\n"...)
	}
}

// framing are the fields kvcar writes itself from what the answer is.
func framing(k string) bool {
	return k == "Content-Length" || k == "Transfer-Encoding" || k == "Connection" || k == "Trailer"
}

// appendFields appends the handler's fields but the framing ones, sorted
// by name as net/http sorts them; a line break in a value becomes a
// space, so that a value cannot add fields.
func (w *h1writer) appendFields(b []byte) []byte {
	w.keys = w.keys[:0]
	for k := range w.header {
		if !framing(k) {
			w.keys = append(w.keys, k)
		}
	}
	slices.Sort(w.keys)
	for _, k := range w.keys {
		for _, v := range w.header[k] {
			b = append(b, k...)
			b = append(b, ": "...)
			start := len(b)
			b = append(b, strings.TrimSpace(v)...)
			for i := start; i < len(b); i++ {
				if b[i] == '\r' || b[i] == '\n' || b[i] == 0 {
					b[i] = ' '
				}
			}
			b = append(b, "\r\n"...)
		}
	}
	clear(w.keys)
	return b
}

func appendStatusLine(b []byte, code int) []byte {
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, ' ')
	text := http.StatusText(code)
	if text == "" {
		text = "status code " + strconv.Itoa(code)
	}
	b = append(b, text...)
	return append(b, "\r\n"...)
}

func (w *h1writer) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.discard {
		return len(p), nil
	}
	if !w.bodyAllowed {
		return 0, http.ErrBodyNotAllowed
	}
	if w.err != nil {
		return 0, w.err
	}
	if w.declared >= 0 && w.written+int64(len(p)) > w.declared {
		return 0, http.ErrContentLength
	}
	w.written += int64(len(p))
	if w.body == nil {
		w.body = w.c.srv.outBufs.Get().(*[]byte)
	}
	if len(*w.body)+len(p) <= outBufSize {
		*w.body = append(*w.body, p...)
		return len(p), nil
	}
	// Too much to buffer: what is buffered and p go out together, p from
	// the handler's own storage.
	if err := w.send(false, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush sends the head and what is buffered of the body now.
func (w *h1writer) Flush() { _ = w.FlushError() }

// FlushError is Flush, reporting a failed write; http.ResponseController
// calls it.
func (w *h1writer) FlushError() error {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return w.err
	}
	return w.send(false, nil)
}

// finish ends the answer once the handler has returned.
func (w *h1writer) finish() {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.err == nil {
		_ = w.send(true, nil)
	}
	if w.bodyAllowed && w.declared >= 0 && w.written != w.declared {
		// Shorter than its Content-Length: the client waits for the
		// rest, which only the connection's end can tell it will not get.
		w.closeAfter = true
	}
	w.release()
}

// release gives back the body's buffer.
func (w *h1writer) release() {
	if w.body != nil {
		*w.body = (*w.body)[:0]
		w.c.srv.outBufs.Put(w.body)
		w.body = nil
	}
}

// send writes the head, when not yet sent, the buffered body and extra,
// in one write; last ends the body.
func (w *h1writer) send(last bool, extra []byte) error {
	var body []byte
	if w.body != nil {
		body = *w.body
	}
	w.iov = w.iov[:0]
	if !w.headSent {
		w.completeHead(last, len(body)+len(extra), body, extra)
		w.iov = append(w.iov, w.head)
	}
	if n := len(body) + len(extra); n > 0 && w.chunked {
		w.size = strconv.AppendInt(w.size[:0], int64(n), 16)
		w.size = append(w.size, "\r\n"...)
		w.iov = append(w.iov, w.size, body, extra, crlf)
	} else if n > 0 {
		w.iov = append(w.iov, body, extra)
	}
	if last && w.chunked {
		w.iov = append(w.iov, lastChunk)
	}
	w.headSent = true
	if w.body != nil {
		*w.body = (*w.body)[:0]
	}
	if len(w.iov) == 0 {
		return nil
	}
	w.writeRaw(w.iov...)
	return w.err
}

var (
	crlf      = []byte("\r\n")
	lastChunk = []byte("0\r\n\r\n")
)

// completeHead adds the framing fields: the length when the handler set
// it or the whole body is known (last), else chunks in HTTP/1.1 or the
// connection's end in HTTP/1.0; then the connection's fate.
func (w *h1writer) completeHead(last bool, n int, body, extra []byte) {
	switch {
	case !w.bodyAllowed && !w.discard:
		// 204, 304: no body, no length.
	case w.declared >= 0:
		w.head = append(w.head, "Content-Length: "...)
		w.head = strconv.AppendInt(w.head, w.declared, 10)
		w.head = append(w.head, "\r\n"...)
	case w.discard:
		// HEAD without the length the handler would have sent: none.
	case last:
		w.head = append(w.head, "Content-Length: "...)
		w.head = strconv.AppendInt(w.head, int64(n), 10)
		w.head = append(w.head, "\r\n"...)
	case w.minor >= 1:
		w.chunked = true
		w.head = append(w.head, "Transfer-Encoding: chunked\r\n"...)
	default:
		w.closeAfter = true
	}
	if !w.hasType && w.bodyAllowed && n > 0 {
		sniff := body
		if len(sniff) == 0 {
			sniff = extra
		}
		w.head = append(w.head, "Content-Type: "...)
		w.head = append(w.head, http.DetectContentType(sniff[:min(len(sniff), 512)])...)
		w.head = append(w.head, "\r\n"...)
	}
	if w.closeAfter || w.reqClose || w.c.srv.closing.Load() {
		w.closeAfter = true
		w.head = append(w.head, "Connection: close\r\n"...)
	} else if w.minor == 0 && w.keepAlive {
		w.head = append(w.head, "Connection: keep-alive\r\n"...)
	}
	w.head = append(w.head, "\r\n"...)
}

// writeRaw writes bufs to the connection in one write, keeping the first
// error.
func (w *h1writer) writeRaw(bufs ...[]byte) {
	if w.err != nil {
		return
	}
	var err error
	if len(bufs) == 1 {
		_, err = w.c.io.Write(bufs[0])
	} else {
		_, err = w.c.io.Writev(bufs)
	}
	clear(bufs)
	if err != nil {
		w.err = err
	}
}

// sendContinue tells a client waiting with Expect: 100-continue to send
// its body, unless the answer has begun.
func (w *h1writer) sendContinue() error {
	if w.headSent {
		return nil
	}
	w.writeRaw(continueLine)
	return w.err
}

var continueLine = []byte("HTTP/1.1 100 Continue\r\n\r\n")

// dateLine is the Date field's value of one second.
type dateLine struct {
	sec int64
	b   []byte
}

// dateNow is the current Date value, formatted once a second.
func (s *HTTP1Server) dateNow() []byte {
	now := time.Now()
	if d := s.date.Load(); d != nil && d.sec == now.Unix() {
		return d.b
	}
	d := &dateLine{sec: now.Unix(), b: now.UTC().AppendFormat(nil, http.TimeFormat)}
	s.date.Store(d)
	return d.b
}

// newChunkedReader reads a chunked body from br.
func newChunkedReader(br *bufio.Reader) io.Reader { return httputil.NewChunkedReader(br) }
