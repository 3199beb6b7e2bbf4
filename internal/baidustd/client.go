package baidustd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
)

// Client defaults.
const (
	DefaultDialTimeout = time.Second
)

// ErrClientClosed is returned by calls on a closed Client.
var ErrClientClosed = errors.New("baidu_std: client closed")

// ClientOptions configures a Client. Zero values select the defaults.
type ClientOptions struct {
	// DialTimeout bounds connecting (DefaultDialTimeout).
	DialTimeout time.Duration
	// WriteTimeout bounds writing one request (DefaultWriteTimeout).
	WriteTimeout time.Duration
	// MaxBodySize bounds a response frame's body_size
	// (DefaultMaxBodySize).
	MaxBodySize uint32
	// ExtendedMeta adds the RpcMeta fields newer brpc sends
	// (content_type, checksum_type, checksum_value, all zero), as brpc
	// 1.17.0 does; without it requests are written as brpc 1.12.1, the
	// version xLLM pins, writes them.
	ExtendedMeta bool
	// Logger receives connection problems; nil discards them.
	Logger *slog.Logger
}

// CallOptions are a call's optional RpcRequestMeta fields and attachment.
type CallOptions struct {
	LogID      int64
	RequestID  string
	Attachment []byte
}

// Result is a successful call's response.
type Result struct {
	Message    []byte
	Attachment []byte
}

// Client calls one server over one TCP connection, pipelining calls on
// it. It dials on the first call and again on the first call after the
// connection broke. Its methods are safe for concurrent use.
type Client struct {
	addr string
	opts ClientOptions
	log  *slog.Logger

	dialMu sync.Mutex // one dial at a time
	mu     sync.Mutex
	cc     *clientConn
	nextID int64
	closed bool
	wg     sync.WaitGroup // reader goroutines
}

// NewClient makes a client of the server at addr ("host:port"); nothing
// is dialled before the first call.
func NewClient(addr string, opts ClientOptions) *Client {
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = DefaultDialTimeout
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = DefaultWriteTimeout
	}
	if opts.MaxBodySize == 0 {
		opts.MaxBodySize = DefaultMaxBodySize
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Client{addr: addr, opts: opts, log: opts.Logger}
}

// Addr is the server's address.
func (c *Client) Addr() string { return c.addr }

// Close closes the connection, failing the calls in flight, and waits
// for its reader.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	cc := c.cc
	c.cc = nil
	c.mu.Unlock()
	if cc != nil {
		cc.fail(ErrClientClosed)
	}
	c.wg.Wait()
	return nil
}

type callResult struct {
	res Result
	err error
}

// clientConn is one connection and the calls waiting on it. Its reader
// goroutine delivers responses by correlation_id and fails every waiting
// call when the connection breaks.
type clientConn struct {
	c   net.Conn
	wmu sync.Mutex
	// iov and parts hold a frame's parts while they are written, under
	// wmu: writing consumes iov, so it is made again from parts each time.
	iov   net.Buffers
	parts [3][]byte

	mu      sync.Mutex
	pending map[int64]chan callResult
	err     error // why the connection is broken; nil while it works
}

// fail breaks the connection with err, once, and fails the calls waiting.
func (cc *clientConn) fail(err error) {
	cc.mu.Lock()
	if cc.err != nil {
		cc.mu.Unlock()
		return
	}
	cc.err = err
	pending := cc.pending
	cc.pending = nil
	cc.mu.Unlock()
	cc.c.Close()
	for _, ch := range pending {
		ch <- callResult{err: &Error{Code: EFAILEDSOCKET, Text: err.Error(), cause: err}}
	}
}

// conn returns the working connection, dialling one if there is none.
func (c *Client) conn(ctx context.Context) (*clientConn, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClientClosed
	}
	if cc := c.cc; cc != nil && cc.broken() == nil {
		c.mu.Unlock()
		return cc, nil
	}
	c.mu.Unlock()

	c.dialMu.Lock()
	defer c.dialMu.Unlock()
	c.mu.Lock()
	if cc := c.cc; cc != nil && cc.broken() == nil { // another caller dialled meanwhile
		c.mu.Unlock()
		return cc, nil
	}
	c.mu.Unlock()
	dctx, cancel := context.WithTimeout(ctx, c.opts.DialTimeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(dctx, "tcp", c.addr)
	if err != nil {
		return nil, &Error{Code: EFAILEDSOCKET, Text: fmt.Sprintf("Fail to connect %s: %v", c.addr, err), cause: err}
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	cc := &clientConn{c: nc, pending: make(map[int64]chan callResult)}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		nc.Close()
		return nil, ErrClientClosed
	}
	c.cc = cc
	c.wg.Add(1)
	c.mu.Unlock()
	go c.read(cc)
	return cc, nil
}

func (cc *clientConn) broken() error {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.err
}

// read delivers every response on cc until it breaks.
func (c *Client) read(cc *clientConn) {
	defer c.wg.Done()
	r := bufio.NewReader(cc.c)
	for {
		f, err := ReadFrame(r, c.opts.MaxBodySize)
		if err != nil {
			var fe *FrameError
			if errors.As(err, &fe) {
				c.log.Warn("baidu_std client connection closed: bad frame", "server", c.addr, "err", err)
			}
			cc.fail(fmt.Errorf("connection to %s: %w", c.addr, err))
			return
		}
		cid := f.Meta.GetCorrelationId()
		cc.mu.Lock()
		ch := cc.pending[cid]
		delete(cc.pending, cid)
		cc.mu.Unlock()
		if ch == nil {
			// The call gave up (its context ended) before the answer came.
			continue
		}
		ch <- decodeResponse(f, c.opts.MaxBodySize)
	}
}

// decodeResponse turns a response frame into a call's outcome, as brpc's
// client reads it.
func decodeResponse(f Frame, limit uint32) callResult {
	rm := f.Meta.GetResponse()
	if code := rm.GetErrorCode(); code != 0 {
		return callResult{err: &Error{Code: Errno(code), Text: rm.GetErrorText()}}
	}
	msg, att, ok := f.Parts()
	if !ok {
		return callResult{err: Errorf(ERESPONSE, "attachment_size=%d is larger than response_size=%d",
			f.Meta.GetAttachmentSize(), len(f.Payload))}
	}
	if ct := f.Meta.GetCompressType(); ct != CompressNone {
		var err error
		if msg, _, err = decompress(ct, msg, int(limit), nil); err != nil {
			return callResult{err: Errorf(ERESPONSE, "Fail to parse response message, CompressType=%s, response_size=%d",
				compressName(ct), len(f.Payload))}
		}
	}
	return callResult{res: Result{Message: msg, Attachment: att}}
}

// Call calls service/method with the serialized request msg and returns
// the response. The call ends when ctx does (ERPCTIMEDOUT for a
// deadline, the context's error wrapped for a cancellation); a broken
// connection gives EFAILEDSOCKET; a response with an error_code gives
// that *Error.
func (c *Client) Call(ctx context.Context, service, method string, msg []byte, o *CallOptions) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{}, ctxError(err)
	}
	cc, err := c.conn(ctx)
	if err != nil {
		return Result{}, err
	}
	ch := make(chan callResult, 1)
	c.mu.Lock()
	c.nextID++
	cid := c.nextID
	c.mu.Unlock()
	cc.mu.Lock()
	if cc.err != nil {
		err := cc.err
		cc.mu.Unlock()
		return Result{}, &Error{Code: EFAILEDSOCKET, Text: err.Error(), cause: err}
	}
	cc.pending[cid] = ch
	cc.mu.Unlock()

	var att []byte
	if o != nil {
		att = o.Attachment
	}
	meta := requestMeta(service, method, cid, o, c.opts.ExtendedMeta)
	bp := framePool.Get().(*[]byte)
	var werr error
	if len(msg)+len(att) <= inlineFrameBytes {
		frame, err := AppendFrame((*bp)[:0], meta, msg, att)
		if err != nil {
			framePool.Put(bp)
			cc.forget(cid)
			return Result{}, err
		}
		werr = cc.write(c.opts.WriteTimeout, frame)
		*bp = frame
	} else {
		// A large message is written from where it lies, after the
		// header, rather than copied into a frame buffer first.
		head, err := appendHead((*bp)[:0], meta, len(msg), len(att))
		if err != nil {
			framePool.Put(bp)
			cc.forget(cid)
			return Result{}, err
		}
		werr = cc.write(c.opts.WriteTimeout, head, msg, att)
		*bp = head
	}
	if cap(*bp) <= 64<<10 {
		framePool.Put(bp)
	}
	if werr != nil {
		cc.fail(fmt.Errorf("writing to %s: %w", c.addr, werr))
	}

	select {
	case r := <-ch:
		return r.res, r.err
	case <-ctx.Done():
		cc.forget(cid)
		return Result{}, ctxError(ctx.Err())
	}
}

// inlineFrameBytes is the largest message and attachment a call copies
// into its frame buffer to write the frame at once; larger ones are
// written after the header without a copy.
const inlineFrameBytes = 16 << 10

// write writes the parts of one frame, whole, before any other frame.
func (cc *clientConn) write(timeout time.Duration, parts ...[]byte) error {
	cc.wmu.Lock()
	defer cc.wmu.Unlock()
	_ = cc.c.SetWriteDeadline(time.Now().Add(timeout))
	if len(parts) == 1 {
		_, err := cc.c.Write(parts[0])
		return err
	}
	cc.iov = cc.parts[:copy(cc.parts[:], parts)]
	_, err := cc.iov.WriteTo(cc.c)
	cc.parts = [3][]byte{}
	return err
}

func (cc *clientConn) forget(cid int64) {
	cc.mu.Lock()
	delete(cc.pending, cid)
	cc.mu.Unlock()
}

func ctxError(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return &Error{Code: ERPCTIMEDOUT, Text: "reached the call's deadline", cause: err}
	}
	return fmt.Errorf("baidu_std: call abandoned: %w", err)
}

// CallProto calls service/method with req and decodes the response into
// resp.
func (c *Client) CallProto(ctx context.Context, service, method string, req, resp proto.Message, o *CallOptions) error {
	b, err := proto.Marshal(req)
	if err != nil {
		return fmt.Errorf("baidu_std: encoding %s/%s request: %w", service, method, err)
	}
	r, err := c.Call(ctx, service, method, b, o)
	if err != nil {
		return err
	}
	if resp == nil {
		return nil
	}
	if err := proto.Unmarshal(r.Message, resp); err != nil {
		return Errorf(ERESPONSE, "Fail to parse response message, CompressType=none, response_size=%d: %v", len(r.Message), err)
	}
	return nil
}
