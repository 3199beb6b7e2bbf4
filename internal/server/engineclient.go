package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/kvcar/kvcar/internal/sockio"
)

// engineClient relays requests to engines over HTTP/1.1 on the caller's
// own goroutine: the request's head and body go out in one write
// (writev, the body from its storage), the answer is read on the same
// goroutine, and connections are kept per engine address. net/http's
// transport hands every request to a writing and a reading goroutine of
// the connection, two wake-ups a request that cost more CPU than the
// rest of the relay at low concurrency.
//
// A kept connection is used again only while younger than idleTimeout,
// which is shorter than the engines' own, and only once a peek finds the
// engine has not closed it meanwhile (the keep-alive race that gave 502s);
// a request whose write fails on a kept connection has not reached the
// engine and is sent again on a new one. The idle connections are
// bounded per address and in all, and those past idleTimeout are closed
// at most a second later by the next request that puts one back.
type engineClient struct {
	dialer      net.Dialer
	idleTimeout time.Duration
	maxPerHost  int
	maxIdle     int

	mu        sync.Mutex
	idle      map[string][]*keptConn // oldest first
	nIdle     int
	lastSweep time.Time
}

// keptConn is a connection to an engine and its reader.
type keptConn struct {
	addr   string
	conn   net.Conn
	io     *sockio.Conn
	br     *bufio.Reader
	idleAt time.Time
	reused bool
	// unwatch stops the request's context from ending the connection's
	// reads and writes; false means it already has.
	unwatch func() bool
	// iov is the request's head and body as written, and ans the answer
	// read: the connection's own storage, so that a request allocates
	// neither.
	iov [][]byte
	ans answer
	// raw, peekFn, peekBuf and peekOpen are the peek's, and expire what
	// the watch calls: made once per connection, not per request.
	raw      syscall.RawConn
	peekFn   func(fd uintptr) bool
	peekBuf  [1]byte
	peekOpen bool
	expire   func()
	// deadline is the read deadline set last, zero for none.
	deadline time.Time
}

func newKeptConn(addr string, conn net.Conn) *keptConn {
	kc := &keptConn{addr: addr, conn: conn, io: sockio.New(conn)}
	kc.br = bufio.NewReaderSize(kc.io, 4<<10)
	kc.raw = kc.io.Raw()
	kc.peekFn = kc.peek
	kc.expire = func() { _ = kc.conn.SetDeadline(time.Unix(1, 0)) }
	return kc
}

// headDeadline puts the answer's head under engineResponseHeaderTimeout
// from now. The deadline is moved only when it would move by more than a
// second: a timer change per request costs more than the precision is
// worth.
func (kc *keptConn) headDeadline() {
	if want := time.Now().Add(engineResponseHeaderTimeout); kc.deadline.IsZero() || want.Sub(kc.deadline) > time.Second {
		_ = kc.conn.SetReadDeadline(want)
		kc.deadline = want
	}
}

// watch makes every read and write on kc fail once ctx ends, so that a
// client going away frees its handler whatever the engine does.
func (kc *keptConn) watch(ctx context.Context) {
	kc.unwatch = context.AfterFunc(ctx, kc.expire)
}

func newEngineClient() *engineClient {
	return &engineClient{
		dialer:      net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second},
		idleTimeout: engineIdleConnTimeout,
		maxPerHost:  64,
		maxIdle:     1024,
		idle:        map[string][]*keptConn{},
	}
}

// errEngineAnswer is what a malformed or cut-off answer head wraps.
var errEngineAnswer = errors.New("engine answer")

// engineResponseHeaderTimeout bounds the wait for an answer's head: an
// engine's prefill of a long prompt under load takes seconds, not this.
const engineResponseHeaderTimeout = 10 * time.Minute

// roundTrip sends head and body to addr and reads the answer's head
// into kc.ans. The caller reads the answer's body and then calls finish
// with whether it read all of it. tries is how many connections the
// request was written on. A request whose write failed on a kept
// connection is sent again on a new one, up to maxEngineAttempts tries.
func (c *engineClient) roundTrip(ctx context.Context, addr string, method string, head, body []byte) (kc *keptConn, tries int, err error) {
	for tries < maxEngineAttempts {
		tries++
		if kc, err = c.get(ctx, addr); err != nil {
			return nil, tries, err
		}
		kc.watch(ctx)
		kc.headDeadline()
		kc.iov = append(kc.iov[:0], head, body)
		// The wait for the answer is the read's: readHead reports why it
		// ended, if it did not end with the answer.
		_, err = kc.io.Send(kc.iov)
		clear(kc.iov[:cap(kc.iov)])
		if err != nil && !errors.Is(err, sockio.ErrWaiting) {
			kc.unwatch()
			kc.conn.Close()
			if kc.reused && ctx.Err() == nil {
				continue
			}
			return nil, tries, fmt.Errorf("writing the request: %w", err)
		}
		if err = c.readHead(ctx, kc, method); err != nil {
			kc.unwatch()
			kc.conn.Close()
			return nil, tries, err
		}
		return kc, tries, nil
	}
	return nil, tries, fmt.Errorf("writing the request: %w", err)
}

// readHead reads the answer's head into kc.ans, giving up when ctx ends
// (kc is watched) or at the deadline headDeadline set.
func (c *engineClient) readHead(ctx context.Context, kc *keptConn, method string) error {
	err := kc.ans.read(kc.br, method)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%w: connection closed before the answer: %w", errEngineAnswer, err)
		}
		return fmt.Errorf("%w: %w", errEngineAnswer, err)
	}
	// A body of unknown length (SSE) may stream for as long as the
	// engine generates; the client going away ends it through the watch.
	// One of known length is the whole answer already made: it comes
	// under the head's deadline.
	if kc.ans.length < 0 {
		_ = kc.conn.SetReadDeadline(time.Time{})
		kc.deadline = time.Time{}
	}
	return nil
}

// finish keeps kc for the next request when its answer was read whole,
// nothing follows it, the request's context did not end the connection
// and the engine did not ask to close it (nor will, as after an answer
// that ends when the connection does); it closes kc otherwise.
func (c *engineClient) finish(kc *keptConn, whole bool) {
	if !kc.unwatch() || !whole || kc.ans.close || kc.br.Buffered() > 0 {
		kc.conn.Close()
		return
	}
	now := time.Now()
	kc.idleAt = now
	c.mu.Lock()
	var drop []*keptConn
	if now.Sub(c.lastSweep) > time.Second {
		c.lastSweep = now
		drop = c.sweepLocked(now)
	}
	l := c.idle[kc.addr]
	if len(l) >= c.maxPerHost || c.nIdle >= c.maxIdle {
		drop = append(drop, kc)
	} else {
		c.idle[kc.addr] = append(l, kc)
		c.nIdle++
	}
	c.mu.Unlock()
	for _, d := range drop {
		d.conn.Close()
	}
}

// sweepLocked takes the connections idle for longer than idleTimeout
// out of the idle lists and returns them.
func (c *engineClient) sweepLocked(now time.Time) []*keptConn {
	var drop []*keptConn
	for addr, l := range c.idle {
		n := 0
		for n < len(l) && now.Sub(l[n].idleAt) >= c.idleTimeout {
			n++
		}
		if n == 0 {
			continue
		}
		drop = append(drop, l[:n]...)
		c.nIdle -= n
		if n == len(l) {
			delete(c.idle, addr)
		} else {
			c.idle[addr] = append(l[:0], l[n:]...)
		}
		clear(l[len(l)-n:])
	}
	return drop
}

// get returns the most recently used live connection to addr, or a new
// one.
func (c *engineClient) get(ctx context.Context, addr string) (*keptConn, error) {
	for {
		kc := c.takeIdle(addr)
		if kc == nil {
			break
		}
		if time.Since(kc.idleAt) < c.idleTimeout && kc.open() {
			kc.reused = true
			return kc, nil
		}
		kc.conn.Close()
	}
	conn, err := c.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("connecting: %w", err)
	}
	return newKeptConn(addr, conn), nil
}

func (c *engineClient) takeIdle(addr string) *keptConn {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.idle[addr]
	if len(l) == 0 {
		return nil
	}
	kc := l[len(l)-1]
	l[len(l)-1] = nil
	c.idle[addr] = l[:len(l)-1]
	c.nIdle--
	return kc
}

// open reports whether an idle connection is still open and has nothing
// unread: a non-blocking peek that would block. An engine that closed it
// has sent its FIN, which the peek reads as end of stream.
func (kc *keptConn) open() bool {
	if kc.raw == nil {
		return true
	}
	kc.peekOpen = false
	err := kc.raw.Read(kc.peekFn)
	return err == nil && kc.peekOpen
}

// peek is the raw connection's read callback of open. MSG_DONTWAIT
// never blocks, so the raw call need not tell the scheduler.
func (kc *keptConn) peek(fd uintptr) bool {
	_, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&kc.peekBuf[0])), 1,
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	kc.peekOpen = e == syscall.EAGAIN || e == syscall.EWOULDBLOCK
	return true
}

// closeIdle closes every idle connection.
func (c *engineClient) closeIdle() {
	c.mu.Lock()
	var all []*keptConn
	for _, l := range c.idle {
		all = append(all, l...)
	}
	c.idle, c.nIdle = map[string][]*keptConn{}, 0
	c.mu.Unlock()
	for _, kc := range all {
		kc.conn.Close()
	}
}

// appendRequestHead appends an HTTP/1.1 request head. Header values come
// from kvcar or from a request net/http has parsed, which holds no line
// breaks; one that did would be dropped.
func appendRequestHead(b []byte, method, addr, path string, length int, hdr ...string) []byte {
	b = append(b, method...)
	b = append(b, ' ')
	b = append(b, path...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, addr...)
	b = append(b, "\r\nUser-Agent: kvcar\r\n"...)
	if length >= 0 {
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, int64(length), 10)
		b = append(b, "\r\n"...)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] == "" || !headerValueOK(hdr[i+1]) {
			continue
		}
		b = append(b, hdr[i]...)
		b = append(b, ": "...)
		b = append(b, hdr[i+1]...)
		b = append(b, "\r\n"...)
	}
	return append(b, "\r\n"...)
}

func headerValueOK(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c == '\r' || c == '\n' || c == 0 {
			return false
		}
	}
	return true
}
