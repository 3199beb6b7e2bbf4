package server

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
)

// answer is the head of an engine's HTTP/1.1 answer, as much of it as
// kvcar relays or needs to keep the connection, and its body. It is read
// in place from the connection's reader, in kvcar's own storage: the
// part of net/http's ReadResponse the relay needs, without its header
// map, which cost a request nine allocations and more CPU than the rest
// of the relay's reading.
type answer struct {
	status int
	// length is the body's Content-Length, -1 when the body is chunked or
	// ends with the connection.
	length int64
	// close is whether the connection ends after this answer.
	close bool
	// isChunked is whether the body comes in chunks.
	isChunked bool
	// contentType, cacheControl and contentLength are the values kvcar
	// relays, each a one-element slice reused while the engine sends the
	// same value (nil when the answer has none); the client's header
	// takes them as they are.
	contentType, cacheControl, contentLength []string
	body                                     io.Reader

	fixed   fixedBody
	chunked chunkedBody
}

// Bounds of an answer's head; past them the answer is refused as
// malformed. Each line must also fit the connection's reader (4 KiB).
const (
	maxAnswerHeadLines     = 256
	maxInformationalAnswer = 8
)

// read reads an answer's head from br, skipping informational (1xx)
// ones, and sets up its body. method is the request's: the answer to a
// HEAD has no body.
func (a *answer) read(br *bufio.Reader, method string) error {
	for range maxInformationalAnswer {
		if err := a.readHead(br); err != nil {
			return err
		}
		if a.status >= 200 {
			a.setBody(br, method)
			return nil
		}
		if a.status == http.StatusSwitchingProtocols {
			return errors.New("101 Switching Protocols: kvcar does not relay protocol upgrades")
		}
	}
	return fmt.Errorf("more than %d informational (1xx) answers", maxInformationalAnswer)
}

// readHead reads one head: the status line and the header lines.
func (a *answer) readHead(br *bufio.Reader) error {
	line, err := answerLine(br)
	if err != nil {
		return err
	}
	// HTTP/1.x NNN reason
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || (line[7] != '0' && line[7] != '1') ||
		line[8] != ' ' || (len(line) > 12 && line[12] != ' ') {
		return fmt.Errorf("malformed status line %q", truncated(line))
	}
	a.status = 0
	for _, c := range line[9:12] {
		if c < '0' || c > '9' {
			return fmt.Errorf("malformed status code in %q", truncated(line))
		}
		a.status = a.status*10 + int(c-'0')
	}
	if a.status < 100 {
		return fmt.Errorf("malformed status code in %q", truncated(line))
	}
	// HTTP/1.0 closes after the answer unless asked to keep it.
	http10 := line[7] == '0'
	keepAlive := false
	a.length, a.close = -1, false
	a.contentType, a.cacheControl = a.contentType[:0], a.cacheControl[:0]
	chunked, haveLength := false, false
	for n := 0; ; n++ {
		if line, err = answerLine(br); err != nil {
			return err
		}
		if len(line) == 0 {
			break
		}
		if n == maxAnswerHeadLines {
			return fmt.Errorf("more than %d header lines", maxAnswerHeadLines)
		}
		// A name that is no token, as Go's own client refuses it: one
		// that differs from a framing field's only in a byte Unicode
		// folds (Tran\u017ffer-Encoding) would be framing to kvcar and
		// not to the engine's other clients.
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || !validToken(line[:colon]) {
			return fmt.Errorf("malformed header line %q", truncated(line))
		}
		name, value := line[:colon], bytes.Trim(line[colon+1:], " \t")
		switch {
		case asciiEqualFold(name, "Content-Length"):
			v, ok := parseLength(value)
			if !ok || (haveLength && v != a.length) {
				return fmt.Errorf("invalid Content-Length %q", truncated(value))
			}
			a.length, haveLength = v, true
			a.contentLength = reuseValue(a.contentLength, value)
		case asciiEqualFold(name, "Transfer-Encoding"):
			if !asciiEqualFold(value, "chunked") || chunked {
				return fmt.Errorf("unsupported Transfer-Encoding %q", truncated(value))
			}
			chunked = true
		case asciiEqualFold(name, "Connection"):
			for tok := range bytes.SplitSeq(value, []byte(",")) {
				tok = bytes.Trim(tok, " \t")
				a.close = a.close || asciiEqualFold(tok, "close")
				keepAlive = keepAlive || asciiEqualFold(tok, "keep-alive")
			}
		case asciiEqualFold(name, "Content-Type"):
			if len(a.contentType) == 0 && len(value) > 0 {
				a.contentType = reuseValue(a.contentType, value)
			}
		case asciiEqualFold(name, "Cache-Control"):
			if len(a.cacheControl) == 0 && len(value) > 0 {
				a.cacheControl = reuseValue(a.cacheControl, value)
			}
		}
	}
	if chunked {
		// The chunking delimits the body; a length beside it is not the
		// body's (RFC 9112 6.3).
		a.length, haveLength = -1, false
	}
	if !haveLength {
		a.contentLength = a.contentLength[:0]
	}
	a.isChunked = chunked
	// RFC 9112 6.1: an HTTP/1.0 message with Transfer-Encoding has
	// faulty framing; the connection closes after it, whatever it asked.
	a.close = a.close || (http10 && (!keepAlive || chunked))
	return nil
}

// setBody sets a.body to the reader of the answer's body.
func (a *answer) setBody(br *bufio.Reader, method string) {
	switch {
	case method == http.MethodHead || a.status == http.StatusNoContent || a.status == http.StatusNotModified:
		// A length here is the one a GET would have had, not this
		// body's.
		a.length, a.contentLength = 0, a.contentLength[:0]
		a.fixed = fixedBody{br: br}
		a.body = &a.fixed
	case a.isChunked:
		a.chunked = chunkedBody{br: br, r: httputil.NewChunkedReader(br)}
		a.body = &a.chunked
	case a.length >= 0:
		a.fixed = fixedBody{br: br, n: a.length}
		a.body = &a.fixed
	default:
		// No length and no chunking: the body ends with the connection.
		a.close = true
		a.fixed = fixedBody{br: br, n: -1}
		a.body = &a.fixed
	}
}

// reuseValue returns a one-element slice holding value, dst itself when
// it already does: engines send the same values answer after answer.
func reuseValue(dst []string, value []byte) []string {
	if cap(dst) > 0 && dst[:1][0] == string(value) {
		return dst[:1]
	}
	// Capacity one, so that an append by whoever holds the header
	// copies rather than writes into a slice kept here.
	return []string{string(value)}
}

// parseLength parses a Content-Length value: decimal digits only.
func parseLength(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var v int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int64(c-'0')
	}
	return v, true
}

// answerLine returns the next line of a head without its CRLF (or LF),
// valid until br is read again.
func answerLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		return nil, fmt.Errorf("header line longer than %d bytes", br.Size())
	}
	if err != nil {
		if errors.Is(err, io.EOF) && len(line) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

// truncated bounds what of an engine's bytes goes into an error.
func truncated(b []byte) string {
	const n = 64
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}

// fixedBody reads a body of n bytes, or up to the end of the connection
// when n is -1. One that ends early is io.ErrUnexpectedEOF, so that the
// relay knows the answer was not whole.
type fixedBody struct {
	br *bufio.Reader
	n  int64
}

func (f *fixedBody) Read(p []byte) (int, error) {
	if f.n == 0 {
		return 0, io.EOF
	}
	if f.n > 0 && int64(len(p)) > f.n {
		p = p[:f.n]
	}
	n, err := f.br.Read(p)
	if f.n > 0 {
		f.n -= int64(n)
		if errors.Is(err, io.EOF) && f.n > 0 {
			err = io.ErrUnexpectedEOF
		}
	}
	return n, err
}

// chunkedBody reads a chunked body and, after its last chunk, the
// trailer, so that the connection is left at the next answer and can be
// kept.
type chunkedBody struct {
	br   *bufio.Reader
	r    io.Reader
	done bool
}

func (c *chunkedBody) Read(p []byte) (int, error) {
	if c.done {
		return 0, io.EOF
	}
	n, err := c.r.Read(p)
	if errors.Is(err, io.EOF) {
		for range maxAnswerHeadLines {
			line, lerr := answerLine(c.br)
			if lerr != nil {
				return n, io.ErrUnexpectedEOF
			}
			if len(line) == 0 {
				c.done = true
				return n, io.EOF
			}
			if _, _, err := fieldLine(line); err != nil {
				return n, fmt.Errorf("%w: trailer: %w", errEngineAnswer, err)
			}
		}
		return n, fmt.Errorf("%w: more than %d trailer lines", errEngineAnswer, maxAnswerHeadLines)
	}
	return n, err
}
