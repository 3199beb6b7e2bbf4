package server

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"strconv"
)

// headError is a request head kvcar refuses: the status it answers with
// and a message naming what is wrong. The connection is closed after the
// answer, as its framing can no longer be trusted.
type headError struct {
	status  int
	message string
}

func (e *headError) Error() string { return e.message }

func badHead(format string, args ...any) *headError {
	return &headError{status: http.StatusBadRequest, message: fmt.Sprintf(format, args...)}
}

// reqHead is what the serving loop needs of a request head; header holds
// every field, canonically keyed as net/http keys them.
type reqHead struct {
	method, target string
	minor          int // HTTP/1.minor
	contentLength  int64
	chunked        bool
	// close is whether the connection ends after this request: asked by
	// the client, or HTTP/1.0 without keep-alive.
	close          bool
	keepAlive      bool // HTTP/1.0 "Connection: keep-alive"
	expectContinue bool
	host           string
}

// headReader reads request heads from a connection's reader within a byte
// limit, keeping what it can from one head to the next so that a client
// sending the same fields request after request costs no allocation for
// them.
type headReader struct {
	br       *bufio.Reader
	maxBytes int
	// used counts the head's bytes read so far, against maxBytes.
	used int
	// long holds a line longer than br's buffer.
	long []byte
	// header is the map handed to handlers, reused: an entry whose value
	// did not change keeps its slice. seen lists the keys set by the head
	// being read.
	header http.Header
	seen   []string
	// lastTarget and lastHost are the previous request's, reused when
	// repeated.
	lastTarget, lastHost string
}

// maxHeadFields bounds the field lines of a request head, and of a
// chunked body's trailer: what a head's fields cost to record grows
// with the square of their number (add looks each key up among those
// seen), and within a 1 MiB head 80,000 names took over 10 s of CPU.
// Clients send a few dozen; Apache httpd's default limit is 100.
const maxHeadFields = 256

// errHeadTooLarge is a head past maxBytes.
var errHeadTooLarge = errors.New("request head too large")

// line returns the next head line without its line ending (CRLF, or a
// bare LF as net/http also takes), valid until the next read.
func (hr *headReader) line() ([]byte, error) {
	b, err := hr.br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		hr.long = append(hr.long[:0], b...)
		for errors.Is(err, bufio.ErrBufferFull) {
			if hr.used+len(hr.long) > hr.maxBytes {
				return nil, errHeadTooLarge
			}
			b, err = hr.br.ReadSlice('\n')
			hr.long = append(hr.long, b...)
		}
		b = hr.long
		if cap(hr.long) > 64<<10 {
			// A rare long line does not pin its storage.
			hr.long = nil
		}
	}
	hr.used += len(b)
	if err != nil {
		if errors.Is(err, io.EOF) && hr.used > 0 {
			return nil, io.ErrUnexpectedEOF
		}
		return nil, err
	}
	if hr.used > hr.maxBytes {
		return nil, errHeadTooLarge
	}
	b = b[:len(b)-1]
	if n := len(b); n > 0 && b[n-1] == '\r' {
		b = b[:n-1]
	}
	return b, nil
}

// read reads one request head into h. A *headError is a head to refuse
// with its status; any other error is the connection's (closed, timed
// out, cut off), with nothing to answer.
func (hr *headReader) read(h *reqHead) error {
	hr.used = 0
	line, err := hr.line()
	if err != nil {
		return hr.readErr(err)
	}
	if err := hr.requestLine(h, line); err != nil {
		return err
	}
	*h = reqHead{method: h.method, target: h.target, minor: h.minor, contentLength: -1}
	hr.seen = hr.seen[:0]
	if hr.header == nil {
		hr.header = make(http.Header, 8)
	}
	haveLength, haveHost := false, false
	lengthValue := ""
	for n := 0; ; n++ {
		if line, err = hr.line(); err != nil {
			return hr.readErr(err)
		}
		if len(line) == 0 {
			break
		}
		if n == maxHeadFields {
			return &headError{status: http.StatusRequestHeaderFieldsTooLarge,
				message: "request head has more than " + strconv.Itoa(maxHeadFields) + " header fields"}
		}
		name, value, err := fieldLine(line)
		if err != nil {
			return badHead("%s", err.Error())
		}
		key, stored := hr.add(name, value)
		switch key {
		case "Content-Length":
			// Repeats of one value are taken, as net/http takes them;
			// differing ones are how a request is smuggled past a proxy.
			if haveLength && stored != lengthValue {
				return badHead("conflicting Content-Length headers %s and %s", strconv.Quote(lengthValue), quoteTrunc(value))
			}
			v, ok := parseLength(value)
			if !ok {
				return badHead("invalid Content-Length %s", quoteTrunc(value))
			}
			h.contentLength, haveLength, lengthValue = v, true, stored
		case "Transfer-Encoding":
			if h.chunked || !asciiEqualFold(value, "chunked") {
				return &headError{status: http.StatusNotImplemented,
					message: "unsupported Transfer-Encoding " + quoteTrunc(value) + ": only one chunked coding is taken"}
			}
			h.chunked = true
		case "Host":
			if haveHost {
				return badHead("more than one Host header")
			}
			if !validHost(value) {
				return badHead("invalid Host header %s", quoteTrunc(value))
			}
			h.host, haveHost = stored, true
		case "Connection":
			for tok := range bytes.SplitSeq(value, []byte(",")) {
				tok = bytes.Trim(tok, " \t")
				h.close = h.close || asciiEqualFold(tok, "close")
				h.keepAlive = h.keepAlive || asciiEqualFold(tok, "keep-alive")
			}
		case "Expect":
			if !asciiEqualFold(value, "100-continue") {
				return &headError{status: http.StatusExpectationFailed, message: "unsupported Expect " + quoteTrunc(value)}
			}
			h.expectContinue = h.minor >= 1
		}
	}
	hr.dropUnseen()
	// Handlers find the host in the request's Host, as from net/http,
	// not among the fields.
	delete(hr.header, "Host")
	if haveLength {
		// One value, as net/http keeps it, however often it was repeated.
		if vs := hr.header["Content-Length"]; len(vs) > 1 {
			hr.header["Content-Length"] = vs[:1:1]
		}
	}
	if h.chunked {
		// Handlers see the coding in the request's TransferEncoding, as
		// from net/http, not among the fields.
		delete(hr.header, "Transfer-Encoding")
		if haveLength {
			// RFC 9112 6.1: such a request "ought to be handled as an
			// error"; two framings are how requests are smuggled.
			return badHead("both Content-Length and Transfer-Encoding: chunked")
		}
		if h.minor == 0 {
			return badHead("Transfer-Encoding in an HTTP/1.0 request")
		}
	}
	if h.minor >= 1 && !haveHost {
		return badHead("missing Host header (required in HTTP/1.1)")
	}
	h.close = h.close || (h.minor == 0 && !h.keepAlive)
	return nil
}

// readErr maps a read error of the head: past the byte limit is a 431,
// the rest are the connection's.
func (hr *headReader) readErr(err error) error {
	if errors.Is(err, errHeadTooLarge) {
		return &headError{status: http.StatusRequestHeaderFieldsTooLarge,
			message: "request head exceeds " + strconv.Itoa(hr.maxBytes) + " bytes"}
	}
	return err
}

// requestLine parses "METHOD SP target SP HTTP/1.x" into h.
func (hr *headReader) requestLine(h *reqHead, line []byte) error {
	sp1 := bytes.IndexByte(line, ' ')
	sp2 := bytes.LastIndexByte(line, ' ')
	if sp1 <= 0 || sp2 <= sp1+1 {
		return badHead("malformed request line %s", quoteTrunc(line))
	}
	method, target, proto := line[:sp1], line[sp1+1:sp2], line[sp2+1:]
	if !validToken(method) {
		return badHead("invalid method %s", quoteTrunc(method))
	}
	if len(proto) != 8 || !bytes.HasPrefix(proto, []byte("HTTP/")) || proto[6] != '.' ||
		proto[5] < '0' || proto[5] > '9' || proto[7] < '0' || proto[7] > '9' {
		return badHead("malformed HTTP version %s", quoteTrunc(proto))
	}
	if proto[5] != '1' || proto[7] > '1' {
		return &headError{status: http.StatusHTTPVersionNotSupported,
			message: "HTTP version " + string(proto[5:]) + " not supported; kvcar serves HTTP/1.0 and HTTP/1.1"}
	}
	for _, c := range target {
		if c <= ' ' || c == 0x7f {
			return badHead("invalid character in the request target %s", quoteTrunc(target))
		}
	}
	h.minor = int(proto[7] - '0')
	h.method = internMethod(method)
	if string(target) != hr.lastTarget {
		hr.lastTarget = string(target)
	}
	h.target = hr.lastTarget
	return nil
}

func internMethod(m []byte) string {
	switch string(m) {
	case http.MethodPost:
		return http.MethodPost
	case http.MethodGet:
		return http.MethodGet
	case http.MethodHead:
		return http.MethodHead
	}
	return string(m)
}

// commonKeys are the canonical forms of the fields clients commonly send,
// found without allocating.
var commonKeys = []string{"Host", "User-Agent", "Accept", "Accept-Encoding", "Content-Type", "Content-Length",
	"Connection", "Transfer-Encoding", "Expect", "Authorization", "Accept-Language", "Cache-Control",
	"X-Request-Id", "Traceparent", "Keep-Alive", "Upgrade", "Cookie", "Origin", "Referer"}

// add records one field and returns its canonical key and the value as
// stored, reusing the previous head's slice when the value is the same.
func (hr *headReader) add(name, value []byte) (key, stored string) {
	for _, k := range commonKeys {
		if asciiEqualFold(name, k) {
			key = k
			break
		}
	}
	if key == "" {
		key = textproto.CanonicalMIMEHeaderKey(string(name))
	}
	if key == "Host" && hr.lastHost == string(value) {
		// Removed from the fields once read; kept here for the next head.
		hr.seen = append(hr.seen, key)
		hr.header[key] = append(hr.header[key], hr.lastHost)
		return key, hr.lastHost
	}
	vs, fresh := hr.header[key], true
	for _, k := range hr.seen {
		if k == key {
			fresh = false
			break
		}
	}
	if fresh {
		hr.seen = append(hr.seen, key)
		if len(vs) == 1 && vs[0] == string(value) {
			return key, vs[0]
		}
		// Capacity one, so that a handler's append copies.
		vs = vs[:0:0]
	}
	stored = string(value)
	hr.header[key] = append(vs, stored)
	if key == "Host" {
		hr.lastHost = stored
	}
	return key, stored
}

// dropUnseen removes the fields the last head did not send.
func (hr *headReader) dropUnseen() {
	if len(hr.header) == len(hr.seen) {
		return
	}
	for k := range hr.header {
		found := false
		for _, s := range hr.seen {
			if s == k {
				found = true
				break
			}
		}
		if !found {
			delete(hr.header, k)
		}
	}
}

// fieldLine splits a field line into its name and its value without
// the whitespace around it, and refuses what RFC 9112 5 does not allow:
// obsolete line folding, a name that is no token (a space before the
// colon included), a control character in the value.
func fieldLine(line []byte) (name, value []byte, err error) {
	if len(line) > 0 && (line[0] == ' ' || line[0] == '\t') {
		return nil, nil, fmt.Errorf("obsolete line folding in header line %s", quoteTrunc(line))
	}
	colon := bytes.IndexByte(line, ':')
	if colon <= 0 || !validToken(line[:colon]) {
		return nil, nil, fmt.Errorf("malformed header line %s", quoteTrunc(line))
	}
	name, value = line[:colon], bytes.Trim(line[colon+1:], " \t")
	if !validValue(value) {
		return nil, nil, fmt.Errorf("invalid character in the value of header %s", quoteTrunc(name))
	}
	return name, value, nil
}

// asciiEqualFold reports whether b is s, which is ASCII, in any case of
// its ASCII letters. bytes.EqualFold folds Unicode too: it takes
// "chun\u212aed" (a Kelvin sign) for "chunked", which a proxy in front
// of kvcar would not, and a framing two parties read differently is how
// requests are smuggled.
func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		c, d := b[i], s[i]
		if c|0x20 != d|0x20 || (c|0x20 < 'a' || c|0x20 > 'z') && c != d {
			return false
		}
	}
	return true
}

// validToken reports whether b is an RFC 9110 token (a method or a field
// name).
func validToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if c >= 0x80 || !tokenChar[c] {
			return false
		}
	}
	return true
}

var tokenChar = asciiTable("!#$%&'*+-.^_`|~")

// validValue reports whether a field value holds no control character
// but tab (RFC 9110 5.5; obs-text is taken, as net/http takes it).
func validValue(b []byte) bool {
	for _, c := range b {
		if (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// validHost reports whether a Host value holds only the characters of a
// host and port, IP literals and percent-encoding included.
func validHost(b []byte) bool {
	for _, c := range b {
		if c >= 0x80 || !hostChar[c] {
			return false
		}
	}
	return true
}

// hostChar are the bytes net/http takes in a Host value.
var hostChar = asciiTable("!$%&'()*+,-.:;=[]_~")

// asciiTable marks the letters, the digits and extra.
func asciiTable(extra string) (t [128]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range extra {
		t[c] = true
	}
	return t
}

// quoteTrunc quotes a client's bytes for an error message, bounded.
func quoteTrunc(b []byte) string { return strconv.Quote(truncated(b)) }
