package server

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"unicode/utf8"
)

// requestError is a rejected request: the status to send and a message
// naming the offending field.
type requestError struct {
	status  int
	message string
}

func (e *requestError) Error() string { return e.message }

func badRequest(format string, args ...any) *requestError {
	return &requestError{status: http.StatusBadRequest, message: fmt.Sprintf(format, args...)}
}

// scanner reads a request body in chunks through a reusable buffer, so
// that a body of a million ids is never held in memory as text.
type scanner struct {
	r        io.Reader
	buf      []byte
	pos, end int
	// consumed counts the bytes before buf[0], for error offsets.
	consumed int64
	// limit is the body limit, named when the body exceeds it.
	limit int64
	eof   bool
	err   error
}

func (s *scanner) offset() int64 { return s.consumed + int64(s.pos) }

// fill replaces the buffer contents with the next chunk of the body and
// reports whether any byte is available.
func (s *scanner) fill() bool {
	if s.eof || s.err != nil {
		return false
	}
	s.consumed += int64(s.end)
	s.pos, s.end = 0, 0
	for range 100 {
		n, err := s.r.Read(s.buf)
		s.end = n
		if err != nil {
			if errors.Is(err, io.EOF) {
				s.eof = true
			} else {
				s.err = err
			}
			return n > 0
		}
		if n > 0 {
			return true
		}
	}
	s.err = io.ErrNoProgress
	return false
}

// peek returns the next byte without consuming it.
func (s *scanner) peek() (byte, bool) {
	if s.pos == s.end && !s.fill() {
		return 0, false
	}
	return s.buf[s.pos], true
}

// skipSpace consumes JSON whitespace and returns the next byte.
func (s *scanner) skipSpace() (byte, bool) {
	for {
		for s.pos < s.end {
			c := s.buf[s.pos]
			if c != ' ' && c != '\n' && c != '\r' && c != '\t' {
				return c, true
			}
			s.pos++
		}
		if !s.fill() {
			return 0, false
		}
	}
}

// endError explains why no byte was available: a read failure (the body
// limit included) or a body that stops mid-value.
func (s *scanner) endError() *requestError {
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(s.err, &tooBig):
		return &requestError{status: http.StatusRequestEntityTooLarge,
			message: "request body exceeds " + strconv.FormatInt(s.limit, 10) + " bytes"}
	case s.err != nil:
		return badRequest("reading request body: %v", s.err)
	default:
		return badRequest("invalid JSON: unexpected end of body at offset %d", s.offset())
	}
}

func (s *scanner) syntaxError(c byte) *requestError {
	return badRequest("invalid JSON: unexpected character %s at offset %d", strconv.QuoteRune(rune(c)), s.offset())
}

// kindAt names the JSON type of the value starting at the current byte
// c, for messages. Literals are checked in full so that "nul" is reported
// as invalid JSON rather than as null; the bytes read are consumed, which
// is harmless because the request is rejected either way.
func (s *scanner) kindAt(c byte) (string, *requestError) {
	switch c {
	case '"':
		return "a string", nil
	case '[':
		return "an array", nil
	case '{':
		return "an object", nil
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return "a number", nil
	}
	var lit, kind string
	switch c {
	case 't':
		lit, kind = "true", "a boolean"
	case 'f':
		lit, kind = "false", "a boolean"
	case 'n':
		lit, kind = "null", "null"
	default:
		return "", s.syntaxError(c)
	}
	for i := 0; i < len(lit); i++ {
		b, ok := s.peek()
		if !ok {
			return "", s.endError()
		}
		if b != lit[i] {
			return "", s.syntaxError(b)
		}
		s.pos++
	}
	return kind, nil
}

// maxKeyShown bounds the part of an unknown key kept for the message.
const maxKeyShown = 64

// parseQuery parses {"token_ids":[...]} from s, appending the ids to ids.
// The returned slice is ids extended, also on error, so that its
// capacity can be reused.
func parseQuery(s *scanner, ids []uint32, maxIDs int) ([]uint32, *requestError) {
	c, ok := s.skipSpace()
	if !ok {
		if s.err == nil {
			return ids, badRequest(`request body is empty; expected {"token_ids":[...]}`)
		}
		return ids, s.endError()
	}
	if c != '{' {
		k, err := s.kindAt(c)
		if err != nil {
			return ids, err
		}
		return ids, badRequest(`request body must be a JSON object {"token_ids":[...]}, got %s`, k)
	}
	s.pos++
	seen := false
	for {
		c, ok := s.skipSpace()
		if !ok {
			return ids, s.endError()
		}
		if c == '}' && !seen {
			s.pos++
			break
		}
		if c != '"' {
			return ids, s.syntaxError(c)
		}
		var kb [maxKeyShown]byte
		n, err := s.readKey(&kb)
		if err != nil {
			return ids, err
		}
		key := kb[:n]
		if c, ok = s.skipSpace(); !ok {
			return ids, s.endError()
		}
		if c != ':' {
			return ids, s.syntaxError(c)
		}
		s.pos++
		if string(key) != "token_ids" {
			return ids, badRequest(`unknown field %s: only "token_ids" is accepted`, strconv.Quote(string(key)))
		}
		if seen {
			return ids, badRequest(`token_ids: given more than once`)
		}
		seen = true
		if ids, err = s.readIDs(ids, maxIDs); err != nil {
			return ids, err
		}
		if c, ok = s.skipSpace(); !ok {
			return ids, s.endError()
		}
		s.pos++
		if c == '}' {
			break
		}
		if c != ',' {
			s.pos--
			return ids, s.syntaxError(c)
		}
	}
	if !seen {
		return ids, badRequest(`token_ids: missing; expected {"token_ids":[...]}`)
	}
	if c, ok := s.skipSpace(); ok {
		return ids, badRequest("unexpected data after the JSON object at offset %d (%s)", s.offset(), strconv.QuoteRune(rune(c)))
	}
	if s.err != nil {
		return ids, s.endError()
	}
	return ids, nil
}

// readKey decodes the object key starting at the opening quote. Only the
// first maxKeyShown bytes are kept: any longer key is unknown anyway.
func (s *scanner) readKey(kb *[maxKeyShown]byte) (int, *requestError) {
	s.pos++
	n := 0
	put := func(b ...byte) {
		for _, c := range b {
			if n < len(kb) {
				kb[n] = c
				n++
			}
		}
	}
	for {
		c, ok := s.peek()
		if !ok {
			return 0, s.endError()
		}
		s.pos++
		switch {
		case c == '"':
			return n, nil
		case c < 0x20:
			s.pos--
			return 0, s.syntaxError(c)
		case c != '\\':
			put(c)
			continue
		}
		e, ok := s.peek()
		if !ok {
			return 0, s.endError()
		}
		s.pos++
		switch e {
		case '"', '\\', '/':
			put(e)
		case 'b':
			put('\b')
		case 'f':
			put('\f')
		case 'n':
			put('\n')
		case 'r':
			put('\r')
		case 't':
			put('\t')
		case 'u':
			var r rune
			for range 4 {
				h, ok := s.peek()
				if !ok {
					return 0, s.endError()
				}
				v, isHex := hexValue(h)
				if !isHex {
					return 0, s.syntaxError(h)
				}
				s.pos++
				r = r<<4 | rune(v)
			}
			// A surrogate half can never be part of "token_ids", so it
			// is kept only as U+FFFD for the message.
			if r >= 0xd800 && r < 0xe000 {
				r = 0xfffd
			}
			var enc [4]byte
			put(enc[:utf8.EncodeRune(enc[:], r)]...)
		default:
			s.pos--
			return 0, s.syntaxError(e)
		}
	}
}

func hexValue(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// readIDs parses the token_ids array starting at its first byte.
func (s *scanner) readIDs(ids []uint32, maxIDs int) ([]uint32, *requestError) {
	c, ok := s.skipSpace()
	if !ok {
		return ids, s.endError()
	}
	if c != '[' {
		k, err := s.kindAt(c)
		if err != nil {
			return ids, err
		}
		return ids, badRequest("token_ids: must be an array of integers, got %s", k)
	}
	s.pos++
	if c, ok = s.skipSpace(); !ok {
		return ids, s.endError()
	}
	if c == ']' {
		s.pos++
		return ids, nil
	}
	start := len(ids)
	for {
		index := len(ids) - start
		if index >= maxIDs {
			return ids, badRequest("token_ids: more than %d ids", maxIDs)
		}
		id, err := s.readID(index)
		if err != nil {
			return ids, err
		}
		ids = append(ids, id)
		if c, ok = s.skipSpace(); !ok {
			return ids, s.endError()
		}
		s.pos++
		switch c {
		case ',':
			if c, ok = s.skipSpace(); !ok {
				return ids, s.endError()
			}
		case ']':
			return ids, nil
		default:
			s.pos--
			return ids, s.syntaxError(c)
		}
	}
}

// maxLiteralShown bounds how much of a bad number is quoted back.
const maxLiteralShown = 32

// readID parses one array element, which must be a JSON integer in the
// uint32 range; the first byte has been peeked and is not whitespace.
func (s *scanner) readID(index int) (uint32, *requestError) {
	// Fast path: a plain id of at most ten digits that ends inside the
	// buffer, which is nearly every id of a real request.
	if p := s.buf[s.pos:s.end]; len(p) > 10 && p[0] >= '1' && p[0] <= '9' {
		v := uint64(p[0] - '0')
		i := 1
		for ; i < 11; i++ {
			d := p[i] - '0'
			if d > 9 {
				break
			}
			v = v*10 + uint64(d)
		}
		if i < 11 && v <= math.MaxUint32 && p[i] != '.' && p[i] != 'e' && p[i] != 'E' {
			s.pos += i
			return uint32(v), nil
		}
	}
	c := s.buf[s.pos]
	if c != '-' && (c < '0' || c > '9') {
		k, err := s.kindAt(c)
		if err != nil {
			return 0, err
		}
		return 0, badRequest("token_ids[%d]: must be an integer in [0, 4294967295], got %s", index, k)
	}
	var lit [maxLiteralShown]byte
	n := 0
	neg := c == '-'
	if neg {
		lit[0] = '-'
		n = 1
		s.pos++
	}
	var v uint64
	digits := 0
	leadingZero := false
	for {
		for s.pos < s.end {
			d := s.buf[s.pos] - '0'
			if d > 9 {
				goto done
			}
			if digits == 1 && leadingZero {
				return 0, s.syntaxError(s.buf[s.pos])
			}
			if digits == 0 && d == 0 {
				leadingZero = true
			}
			if v <= math.MaxUint32 {
				v = v*10 + uint64(d)
			}
			if n < len(lit) {
				lit[n] = s.buf[s.pos]
				n++
			}
			digits++
			s.pos++
		}
		if !s.fill() {
			break
		}
	}
done:
	if digits == 0 {
		if c, ok := s.peek(); ok {
			return 0, s.syntaxError(c)
		}
		return 0, s.endError()
	}
	if c, ok := s.peek(); ok && (c == '.' || c == 'e' || c == 'E') {
		// Quote the rest of the number back, but reject it either way.
		for ok && (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-' || (c >= '0' && c <= '9')) {
			if n < len(lit) {
				lit[n] = c
				n++
			}
			s.pos++
			c, ok = s.peek()
		}
		return 0, badRequest("token_ids[%d]: must be an integer in [0, 4294967295], got %s", index, shownLiteral(lit[:n], n == len(lit)))
	}
	if (neg && v != 0) || v > math.MaxUint32 {
		return 0, badRequest("token_ids[%d]: must be an integer in [0, 4294967295], got %s", index, shownLiteral(lit[:n], n == len(lit)))
	}
	return uint32(v), nil
}

func shownLiteral(lit []byte, truncated bool) string {
	if truncated {
		return string(lit) + "..."
	}
	return string(lit)
}
