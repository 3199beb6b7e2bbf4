package server

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"net/http"
	"strconv"
	"unicode/utf8"

	"github.com/kvcar/kvcar/internal/budget"
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
//
// With keep set, buf instead collects the whole body: each chunk is read
// after the previous ones, so offsets index the body and the body can be
// relayed byte for byte. Every byte kept is first taken from budget (when
// not nil) and held until the owner gives it back.
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

	keep   bool
	budget *budget.Bytes
	// held is what this body has taken from budget.
	held int64
}

// errBusy ends a kept body that the in-flight budget cannot take.
var errBusy = errors.New("too many request bytes in flight")

func (s *scanner) offset() int64 { return s.consumed + int64(s.pos) }

// fill reads the next chunk of the body, in place of the buffer's
// contents or, when keeping the body, after them, and reports whether
// any byte is available.
func (s *scanner) fill() bool {
	if s.eof || s.err != nil {
		return false
	}
	var p []byte
	if s.keep {
		if p = s.nextKept(); p == nil {
			return false
		}
	} else {
		s.consumed += int64(s.end)
		s.pos, s.end = 0, 0
		p = s.buf
	}
	for range 100 {
		n, err := s.r.Read(p)
		s.end += n
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

// nextKept returns where the next chunk of a kept body goes, growing buf
// and taking from the budget as needed; nil, with s.err set, when either
// is refused.
func (s *scanner) nextKept() []byte {
	if s.end == len(s.buf) && !s.growKept() {
		return nil
	}
	// A body whose whole length the budget holds (its Content-Length)
	// is read into the rest of buf at once: a 100 KB body in one or two
	// reads, not one per chunk. One of unknown length takes from the
	// budget a chunk at a time.
	end := len(s.buf)
	if int64(end) > s.held {
		end = min(end, s.end+readChunk)
	}
	p := s.buf[s.end:end]
	if want := int64(s.end + len(p)); want > s.held {
		if !s.budget.Take(want - s.held) {
			s.err = errBusy
			return nil
		}
		s.held = want
	}
	return p
}

// growKept doubles buf, never past one byte over the body limit: that
// byte is where the limit's reader reports the excess.
func (s *scanner) growKept() bool {
	next := max(2*len(s.buf), readChunk)
	if s.limit > 0 {
		next = min(next, int(s.limit)+1)
	}
	if next <= len(s.buf) {
		s.err = &http.MaxBytesError{Limit: s.limit}
		return false
	}
	buf := make([]byte, next)
	copy(buf, s.buf[:s.end])
	s.buf = buf
	return true
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
	case errors.Is(s.err, errBusy):
		return &requestError{status: http.StatusServiceUnavailable,
			message: "too many request bytes in flight; retry later"}
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
		if ids, err = s.readIDs(ids, maxIDs, "token_ids"); err != nil {
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

// readIDs parses the id array named name (for messages) starting at its
// first byte.
func (s *scanner) readIDs(ids []uint32, maxIDs int, name string) ([]uint32, *requestError) {
	c, ok := s.skipSpace()
	if !ok {
		return ids, s.endError()
	}
	if c != '[' {
		k, err := s.kindAt(c)
		if err != nil {
			return ids, err
		}
		return ids, badRequest("%s: must be an array of integers, got %s", name, k)
	}
	s.pos++
	return s.readIDElems(ids, maxIDs, name)
}

// readIDElems parses the elements of an id array whose '[' has been
// consumed, and its ']'.
func (s *scanner) readIDElems(ids []uint32, maxIDs int, name string) ([]uint32, *requestError) {
	c, ok := s.skipSpace()
	if !ok {
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
			return ids, badRequest("%s: more than %d ids", name, maxIDs)
		}
		// Fastest path: runs of plain ids of up to eight digits, each
		// followed at once by ',' or ", " (or the closing ']'), taken
		// 64 bytes at a time.
		if s.end-s.pos >= idBlockNeeds {
			n := len(ids)
			var closed bool
			ids, closed = s.idRun(ids, start+maxIDs)
			if closed {
				return ids, nil
			}
			if len(ids) > n {
				// It stopped after a ',', maybe before whitespace.
				if _, ok = s.skipSpace(); !ok {
					return ids, s.endError()
				}
				continue
			}
		}
		// Fast path: an id of at most ten digits followed at once by ','
		// or ']', inside the buffer: nearly every element of a real
		// request, taken without a call per byte class.
		if p := s.buf[s.pos:s.end]; len(p) > 11 && p[0] >= '1' && p[0] <= '9' {
			v := uint64(p[0] - '0')
			i := 1
			for ; i < 11; i++ {
				d := p[i] - '0'
				if d > 9 {
					break
				}
				v = v*10 + uint64(d)
			}
			if i < 11 && v <= math.MaxUint32 && (p[i] == ',' || p[i] == ']') {
				ids = append(ids, uint32(v))
				s.pos += i + 1
				if p[i] == ']' {
					return ids, nil
				}
				if s.pos < s.end && s.buf[s.pos] >= '1' && s.buf[s.pos] <= '9' {
					continue
				}
				if c, ok = s.skipSpace(); !ok {
					return ids, s.endError()
				}
				continue
			}
		}
		id, err := s.readID(index, name)
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

// idBlockNeeds is how many bytes idRun needs left in the buffer: a
// block of 64 and the eight read from an id that starts at its end.
const idBlockNeeds = 72

// idRun appends the ids at s.pos while they are plain integers of one to
// eight digits, each followed at once by ',' (or ", ") or ']', and the
// buffer holds idBlockNeeds bytes from where it reads; it stops before
// any other element (whitespace, a longer number, anything not an id)
// for the element by element path, and before the id that would make
// ids longer than limit. closed is whether it consumed the array's ']'.
//
// A block of 64 bytes is classified at once (classifyIDs) into bitmaps
// of its digits, commas, spaces and ']', from which bit operations find
// where every id starts and ends and whether anything between them is
// out of place, for the whole block. Each id then costs two bit scans
// and a conversion without a branch per digit, and consecutive ids are
// parsed in parallel instead of each waiting on its digit count.
func (s *scanner) idRun(ids []uint32, limit int) (_ []uint32, closed bool) {
	const zeros = 0x3030303030303030
	p := s.buf[:s.end]
	pos := s.pos
	var m idClasses
	for pos+idBlockNeeds <= len(p) {
		classifyIDs(&m, p[pos:pos+64])
		starts, ends, valid := idMasks(&m)
		// Bit indexes stay below 64: masked with 63 they index blk, and
		// shift, without a bounds check.
		blk := p[pos : pos+idBlockNeeds]
		last := -1
		if ends != 0 && len(ids)+bits.OnesCount64(ends) <= limit && cap(ids)-len(ids) >= 32 {
			if n := takeIDs(&blk[0], starts, ends, &ids[len(ids):cap(ids)][0]); n >= 0 {
				ids = ids[:len(ids)+n]
				last = 63 - bits.LeadingZeros64(ends)
				starts &^= 1<<last - 1
				ends = 0
			}
		}
		for ; ends != 0; ends &= ends - 1 {
			end := bits.TrailingZeros64(ends)
			start := bits.TrailingZeros64(starts)
			n := uint(end - start)
			if n > 8 || len(ids) >= limit {
				s.pos = pos + start
				return ids, false
			}
			a := binary.LittleEndian.Uint64(blk[start&63:]) ^ zeros
			ids = append(ids, uint32(eightDigits(a<<((64-8*n)&63))))
			starts &= starts - 1
			last = end
		}
		if c := m.close & valid; c != 0 {
			// Every id before the ']' was taken: it ends one.
			s.pos = pos + bits.TrailingZeros64(c) + 1
			return ids, true
		}
		next := pos
		switch {
		case starts != 0:
			// An id whose end lies past the block, or past what is in
			// place: the next block starts with it.
			next += bits.TrailingZeros64(starts)
		case last >= 0:
			next += last + 1
			if p[next] == ' ' {
				next++ // ", ", the space maybe past the block
			}
		}
		if next == pos {
			break
		}
		pos = next
	}
	s.pos = pos
	return ids, false
}

// idMasks finds in a block's classes where its ids start and end (the
// byte after each one's last digit), up to the first byte out of place:
// valid has the bits below it. The block starts at an element.
func idMasks(m *idClasses) (starts, ends, valid uint64) {
	digit, sep := m.digit, m.comma|m.close
	// A digit after a non-digit starts an id; the block starts at an
	// element, so bit 0 starts one if it is a digit.
	starts = digit &^ (digit << 1)
	// Out of place: a byte of no class here; a space not after a comma;
	// a comma or ']' not after a digit; a leading zero. Nothing after
	// the first ']' is this array's. So an id starts the block or
	// follows ',' or ", ".
	stop := ^(digit | sep | m.space) |
		m.space&^(m.comma<<1) |
		sep&^(digit<<1) |
		starts&m.zero&(digit>>1) |
		m.close<<1
	// With no stop, 0 - 1: every bit.
	valid = stop&-stop - 1
	return starts & valid, sep & (digit << 1) & valid, valid
}

// nonDigits takes eight bytes less '0' each (XORed with 0x30, little
// endian: the first byte lowest) and sets the top bit of each byte that
// was not a decimal digit: those whose low seven bits reach 10 once 0x76
// is added (the mask keeps the sum inside its byte), or whose top bit was
// already set.
func nonDigits(a uint64) uint64 {
	return ((a & 0x7f7f7f7f7f7f7f7f) + 0x7676767676767676 | a) & 0x8080808080808080
}

// eightDigits is the value of eight decimal digits, one per byte, the
// most significant first (lowest): pairs, then quads, then the eight are
// combined by one multiply each.
func eightDigits(a uint64) uint64 {
	a = (a & 0x0f0f0f0f0f0f0f0f) * (10<<8 + 1) >> 8
	a = (a & 0x00ff00ff00ff00ff) * (100<<16 + 1) >> 16
	return (a & 0x0000ffff0000ffff) * (10000<<32 + 1) >> 32
}

// maxLiteralShown bounds how much of a bad number is quoted back.
const maxLiteralShown = 32

// readID parses element index of the id array name, which must be a
// JSON integer in the uint32 range; the first byte has been peeked and is
// not whitespace.
func (s *scanner) readID(index int, name string) (uint32, *requestError) {
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
		return 0, badRequest("%s[%d]: must be an integer in [0, 4294967295], got %s", name, index, k)
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
		return 0, badRequest("%s[%d]: must be an integer in [0, 4294967295], got %s", name, index, shownLiteral(lit[:n], n == len(lit)))
	}
	if (neg && v != 0) || v > math.MaxUint32 {
		return 0, badRequest("%s[%d]: must be an integer in [0, 4294967295], got %s", name, index, shownLiteral(lit[:n], n == len(lit)))
	}
	return uint32(v), nil
}

func shownLiteral(lit []byte, truncated bool) string {
	if truncated {
		return string(lit) + "..."
	}
	return string(lit)
}

// readString consumes the JSON string starting at its opening quote. With
// keep, its decoded text is appended to dst, which may grow to at most
// maxLen bytes; past that the request is refused with 413 naming what.
// It returns dst and the string's length as written (escapes included),
// which is what a caller that does not keep the text can estimate from.
//
// Escapes decode as encoding/json decodes them: a \u surrogate half that
// is not part of a pair becomes U+FFFD. Bytes are not checked for UTF-8:
// whoever reads the text decides what invalid UTF-8 means.
func (s *scanner) readString(dst []byte, keep bool, maxLen int, what string) ([]byte, int, *requestError) {
	s.pos++
	raw := 0
	var high rune // a pending high surrogate half
	put := func(b []byte) *requestError {
		if !keep {
			return nil
		}
		if len(dst)+len(b) > maxLen {
			return &requestError{status: http.StatusRequestEntityTooLarge,
				message: what + ": text exceeds " + strconv.Itoa(maxLen) + " bytes"}
		}
		dst = append(dst, b...)
		return nil
	}
	var enc [utf8.UTFMax]byte
	putRune := func(r rune) *requestError { return put(enc[:utf8.EncodeRune(enc[:], r)]) }
	flushHigh := func() *requestError {
		if high == 0 {
			return nil
		}
		high = 0
		return putRune(utf8.RuneError)
	}
	for {
		if s.pos == s.end && !s.fill() {
			return dst, raw, s.endError()
		}
		// The plain run up to the next quote, escape or control byte.
		i := s.pos
		for i < s.end {
			c := s.buf[i]
			if c == '"' || c == '\\' || c < 0x20 {
				break
			}
			i++
		}
		if i > s.pos {
			if err := flushHigh(); err != nil {
				return dst, raw, err
			}
			if err := put(s.buf[s.pos:i]); err != nil {
				return dst, raw, err
			}
			raw += i - s.pos
			s.pos = i
		}
		if s.pos == s.end {
			continue
		}
		c := s.buf[s.pos]
		switch {
		case c == '"':
			s.pos++
			return dst, raw, flushHigh()
		case c < 0x20:
			return dst, raw, s.syntaxError(c)
		}
		s.pos++
		e, ok := s.peek()
		if !ok {
			return dst, raw, s.endError()
		}
		s.pos++
		raw += 2
		if e != 'u' {
			if err := flushHigh(); err != nil {
				return dst, raw, err
			}
			var b byte
			switch e {
			case '"', '\\', '/':
				b = e
			case 'b':
				b = '\b'
			case 'f':
				b = '\f'
			case 'n':
				b = '\n'
			case 'r':
				b = '\r'
			case 't':
				b = '\t'
			default:
				s.pos--
				return dst, raw, s.syntaxError(e)
			}
			enc[0] = b
			if err := put(enc[:1]); err != nil {
				return dst, raw, err
			}
			continue
		}
		var r rune
		for range 4 {
			h, ok := s.peek()
			if !ok {
				return dst, raw, s.endError()
			}
			v, isHex := hexValue(h)
			if !isHex {
				return dst, raw, s.syntaxError(h)
			}
			s.pos++
			r = r<<4 | rune(v)
		}
		raw += 4
		var err *requestError
		switch {
		case high != 0 && r >= 0xdc00 && r < 0xe000:
			r, high = 0x10000+(high-0xd800)<<10+(r-0xdc00), 0
			err = putRune(r)
		case r >= 0xd800 && r < 0xdc00:
			err = flushHigh()
			high = r
		case r >= 0xdc00 && r < 0xe000:
			if err = flushHigh(); err == nil {
				err = putRune(utf8.RuneError)
			}
		default:
			if err = flushHigh(); err == nil {
				err = putRune(r)
			}
		}
		if err != nil {
			return dst, raw, err
		}
	}
}

// maxDepth bounds the nesting of a skipped value, as encoding/json does.
const maxDepth = 10000

// skipValue consumes one JSON value, checking its syntax, with stack as
// scratch for the open containers (returned for reuse). Nothing of the
// value is kept.
func (s *scanner) skipValue(stack []byte) ([]byte, *requestError) {
	base := len(stack)
	for {
		// A value is expected here.
		c, ok := s.skipSpace()
		if !ok {
			return stack, s.endError()
		}
		closed := true
		switch c {
		case '{', '[':
			s.pos++
			if len(stack)-base >= maxDepth {
				return stack, badRequest("JSON nested deeper than %d levels at offset %d", maxDepth, s.offset())
			}
			end := byte('}')
			if c == '[' {
				end = ']'
			}
			n, ok := s.skipSpace()
			if !ok {
				return stack, s.endError()
			}
			if n == end {
				s.pos++
				break
			}
			stack = append(stack, c)
			closed = false
			if c == '{' {
				if err := s.skipKey(); err != nil {
					return stack, err
				}
			}
		case '"':
			if _, _, err := s.readString(nil, false, 0, ""); err != nil {
				return stack, err
			}
		case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
			if err := s.skipNumber(); err != nil {
				return stack, err
			}
		default:
			// true, false and null; anything else is a syntax error.
			if _, err := s.kindAt(c); err != nil {
				return stack, err
			}
		}
		if !closed {
			continue
		}
		// After a value: close containers until one has a next element.
		for len(stack) > base {
			c, ok := s.skipSpace()
			if !ok {
				return stack, s.endError()
			}
			top := stack[len(stack)-1]
			if c == ',' {
				s.pos++
				if top == '{' {
					if err := s.skipKey(); err != nil {
						return stack, err
					}
				}
				break
			}
			if (top == '[' && c == ']') || (top == '{' && c == '}') {
				s.pos++
				stack = stack[:len(stack)-1]
				continue
			}
			return stack, s.syntaxError(c)
		}
		if len(stack) == base {
			return stack, nil
		}
	}
}

// skipKey consumes an object key and its colon.
func (s *scanner) skipKey() *requestError {
	c, ok := s.skipSpace()
	if !ok {
		return s.endError()
	}
	if c != '"' {
		return s.syntaxError(c)
	}
	if _, _, err := s.readString(nil, false, 0, ""); err != nil {
		return err
	}
	return s.colon()
}

// afterElement consumes what follows an array element or an object
// member: a comma, after which it returns the next byte and more, or the
// closing end.
func (s *scanner) afterElement(end byte) (next byte, more bool, err *requestError) {
	c, ok := s.skipSpace()
	if !ok {
		return 0, false, s.endError()
	}
	switch c {
	case end:
		s.pos++
		return 0, false, nil
	case ',':
		s.pos++
		if c, ok = s.skipSpace(); !ok {
			return 0, false, s.endError()
		}
		return c, true, nil
	}
	return 0, false, s.syntaxError(c)
}

// memberKey reads the key of an object member, which starts at c, into
// kb as readKey does, and the colon after it.
func (s *scanner) memberKey(c byte, kb *[maxKeyShown]byte) (int, *requestError) {
	if c != '"' {
		return 0, s.syntaxError(c)
	}
	n, err := s.readKey(kb)
	if err != nil {
		return 0, err
	}
	return n, s.colon()
}

// colon consumes the colon after an object key.
func (s *scanner) colon() *requestError {
	c, ok := s.skipSpace()
	if !ok {
		return s.endError()
	}
	if c != ':' {
		return s.syntaxError(c)
	}
	s.pos++
	return nil
}

// skipNumber consumes a JSON number, checking its grammar; its first
// byte has been peeked.
func (s *scanner) skipNumber() *requestError {
	c, _ := s.peek()
	if c == '-' {
		s.pos++
	}
	c, ok := s.peek()
	switch {
	case !ok:
		return s.endError()
	case c == '0':
		s.pos++
	case c >= '1' && c <= '9':
		s.skipDigits()
	default:
		return s.syntaxError(c)
	}
	if c, ok := s.peek(); ok && c == '.' {
		s.pos++
		if s.skipDigits() == 0 {
			return s.numberEnd()
		}
	}
	if c, ok := s.peek(); ok && (c == 'e' || c == 'E') {
		s.pos++
		if c, ok := s.peek(); ok && (c == '+' || c == '-') {
			s.pos++
		}
		if s.skipDigits() == 0 {
			return s.numberEnd()
		}
	}
	return nil
}

// skipDigits consumes decimal digits and returns how many.
func (s *scanner) skipDigits() int {
	n := 0
	for {
		c, ok := s.peek()
		if !ok || c < '0' || c > '9' {
			return n
		}
		s.pos++
		n++
	}
}

// numberEnd reports a number cut short: digits were due.
func (s *scanner) numberEnd() *requestError {
	if c, ok := s.peek(); ok {
		return s.syntaxError(c)
	}
	return s.endError()
}
