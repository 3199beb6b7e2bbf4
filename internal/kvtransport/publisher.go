package kvtransport

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// DefaultSendHWM is the send high-water mark of the engine's sockets: past
// it an XPUB drops live messages and a ROUTER drops replies, silently.
const DefaultSendHWM = 1000

// PublisherOptions tunes the live (XPUB) side of an engine.
type PublisherOptions struct {
	// SendHWM bounds the messages queued per subscriber; 0 means
	// DefaultSendHWM. Messages beyond it are dropped, as the engine does.
	SendHWM int
}

// Publisher is the engine's live channel: an XPUB bound on one endpoint.
// Like every socket here it belongs to the goroutine that bound it.
type Publisher struct {
	sock          *zmq.Socket
	endpoint      string
	subscriptions uint64

	// waitSet holds the XPUB and waitWaker's receiving end, for an
	// engine without a replay server; made once per waker.
	waitSet   *waitSet
	waitWaker *Waker
}

// Wait blocks up to timeout until a subscription reached the publisher or
// w was woken: the wait of an engine that has no replay server.
func (p *Publisher) Wait(w *Waker, timeout time.Duration) error {
	if p.waitSet == nil || p.waitWaker != w {
		p.closeWaitSet()
		// Sent on and read directly: not tracked, always asked.
		ws, err := newWaitSet(w, watch(p.sock, false))
		if err != nil {
			return fmt.Errorf("kvtransport: publisher wait: %w", err)
		}
		p.waitSet, p.waitWaker = ws, w
	}
	if _, err := p.waitSet.wait(timeout); err != nil {
		return fmt.Errorf("kvtransport: publisher wait: %w", err)
	}
	return nil
}

func (p *Publisher) closeWaitSet() {
	if p.waitSet != nil {
		_ = p.waitSet.close() // its own epoll descriptor only
		p.waitSet, p.waitWaker = nil, nil
	}
}

// BindPublisher binds an XPUB on endpoint. Binding port 0 picks a free
// port; Endpoint reports the one chosen.
func (c *Context) BindPublisher(endpoint string, o PublisherOptions) (*Publisher, error) {
	// Every subscribe request is passed up, not only the first per topic,
	// so that the owner can tell each subscriber's arrival.
	verbose := func(s *zmq.Socket) error { return s.SetXpubVerbose(1) }
	s, bound, err := c.bindEngineSocket(zmq.XPUB, endpoint, o.SendHWM, verbose)
	if err != nil {
		return nil, fmt.Errorf("kvtransport: publisher: %w", err)
	}
	return &Publisher{sock: s, endpoint: bound}, nil
}

// bindEngineSocket makes an engine-side socket with the send HWM an
// engine uses (hwm <= 0: DefaultSendHWM), applies extra, and binds it.
func (c *Context) bindEngineSocket(t zmq.Type, endpoint string, hwm int, extra func(*zmq.Socket) error) (*zmq.Socket, string, error) {
	s, err := c.newSocket(t)
	if err != nil {
		return nil, "", err
	}
	if hwm <= 0 {
		hwm = DefaultSendHWM
	}
	if err := s.SetSndhwm(hwm); err != nil {
		s.Close()
		return nil, "", fmt.Errorf("set send hwm: %w", err)
	}
	if extra != nil {
		if err := extra(s); err != nil {
			s.Close()
			return nil, "", fmt.Errorf("set options: %w", err)
		}
	}
	bound, err := routerBind(s, endpoint)
	if err != nil {
		s.Close()
		return nil, "", err
	}
	return s, bound, nil
}

// Endpoint returns the endpoint actually bound, with the real port.
func (p *Publisher) Endpoint() string { return p.endpoint }

// Send publishes one multipart message without blocking. When a
// subscriber's queue is full the message is dropped for it, which a
// subscriber sees as a sequence gap.
func (p *Publisher) Send(frames [][]byte) error {
	if _, err := p.DrainSubscriptions(); err != nil {
		return err
	}
	if err := pubSendFrames(p.sock, nil, frames); err != nil {
		return fmt.Errorf("kvtransport: publish: %w", err)
	}
	return nil
}

// DrainSubscriptions reads the subscribe and unsubscribe requests queued
// on the XPUB without blocking, so they never pile up, and returns the
// total number of subscribe requests seen since the bind.
func (p *Publisher) DrainSubscriptions() (uint64, error) {
	for {
		msg, err := p.sock.RecvBytes(zmq.DONTWAIT)
		if err != nil {
			if pubIsAgain(err) {
				return p.subscriptions, nil
			}
			return p.subscriptions, fmt.Errorf("kvtransport: publisher read subscription: %w", err)
		}
		if len(msg) > 0 && msg[0] == 1 {
			p.subscriptions++
		}
	}
}

// Close closes the socket; queued messages are discarded (LINGER 0).
func (p *Publisher) Close() error {
	p.closeWaitSet()
	if err := p.sock.Close(); err != nil {
		return fmt.Errorf("kvtransport: close publisher: %w", err)
	}
	return nil
}

// ReplayServerOptions tunes the replay (ROUTER) side of an engine.
type ReplayServerOptions struct {
	// SendHWM bounds the replies queued per peer; 0 means DefaultSendHWM.
	// Replies beyond it are dropped silently, so a long snapshot can lose
	// batches or its end marker exactly as with a real engine.
	SendHWM int
}

// ReplayServer is the engine's replay channel: a ROUTER bound on one
// endpoint that answers DEALER requests.
type ReplayServer struct {
	sock     *zmq.Socket
	endpoint string
	poller   *zmq.Poller

	// waitSet holds the ROUTER, waitPub's XPUB and waitWaker's
	// receiving end, made once per pair.
	waitSet   *waitSet
	waitPub   *Publisher
	waitWaker *Waker
}

// Wait blocks up to timeout until a replay request is queued, a
// subscription reached pub, or w was woken, and reports whether a
// request is queued. The engine's loop waits here instead of polling on
// a short timer, so an idle engine costs nothing.
func (r *ReplayServer) Wait(pub *Publisher, w *Waker, timeout time.Duration) (request bool, err error) {
	if r.waitSet == nil || r.waitPub != pub || r.waitWaker != w {
		r.closeWaitSet()
		ws, err := newWaitSet(w, watch(r.sock, false), watch(pub.sock, false))
		if err != nil {
			return false, fmt.Errorf("kvtransport: replay server wait: %w", err)
		}
		r.waitSet, r.waitPub, r.waitWaker = ws, pub, w
	}
	m, err := r.waitSet.wait(timeout)
	if err != nil {
		return m&1 != 0, fmt.Errorf("kvtransport: replay server wait: %w", err)
	}
	return m&1 != 0, nil
}

func (r *ReplayServer) closeWaitSet() {
	if r.waitSet != nil {
		_ = r.waitSet.close() // its own epoll descriptor only
		r.waitSet, r.waitPub, r.waitWaker = nil, nil, nil
	}
}

// BindReplayServer binds a ROUTER on endpoint. Binding port 0 picks a free
// port; Endpoint reports the one chosen.
func (c *Context) BindReplayServer(endpoint string, o ReplayServerOptions) (*ReplayServer, error) {
	s, bound, err := c.bindEngineSocket(zmq.ROUTER, endpoint, o.SendHWM, nil)
	if err != nil {
		return nil, fmt.Errorf("kvtransport: replay server: %w", err)
	}
	p := zmq.NewPoller()
	p.Add(s, zmq.POLLIN)
	return &ReplayServer{sock: s, endpoint: bound, poller: p}, nil
}

// Endpoint returns the endpoint actually bound, with the real port.
func (r *ReplayServer) Endpoint() string { return r.endpoint }

// Recv waits up to timeout for one request and returns the peer identity
// and the frames after it. It returns ErrTimeout when nothing arrived.
func (r *ReplayServer) Recv(timeout time.Duration) (identity []byte, frames [][]byte, err error) {
	ready, err := r.poller.Poll(timeout)
	if err != nil {
		return nil, nil, fmt.Errorf("kvtransport: replay server poll: %w", err)
	}
	if len(ready) == 0 {
		return nil, nil, ErrTimeout
	}
	msg, err := r.sock.RecvMessageBytes(zmq.DONTWAIT)
	if err != nil {
		if pubIsAgain(err) {
			return nil, nil, ErrTimeout
		}
		return nil, nil, fmt.Errorf("kvtransport: replay server receive: %w", err)
	}
	if len(msg) == 0 {
		return nil, nil, errors.New("kvtransport: replay server received an empty message")
	}
	return msg[0], msg[1:], nil
}

// Reply sends frames to the peer named by identity without blocking.
// A reply to a peer that is gone or whose queue is full is dropped, as
// the engine's ROUTER does.
func (r *ReplayServer) Reply(identity []byte, frames [][]byte) error {
	if err := pubSendFrames(r.sock, identity, frames); err != nil {
		return fmt.Errorf("kvtransport: replay reply: %w", err)
	}
	return nil
}

// Close closes the socket; queued replies are discarded (LINGER 0).
func (r *ReplayServer) Close() error {
	r.closeWaitSet()
	if err := r.sock.Close(); err != nil {
		return fmt.Errorf("kvtransport: close replay server: %w", err)
	}
	return nil
}

// routerBind binds s and returns the endpoint libzmq reports, which holds
// the real port when the caller asked for port 0.
func routerBind(s *zmq.Socket, endpoint string) (string, error) {
	if err := s.Bind(endpoint); err != nil {
		return "", fmt.Errorf("bind %s: %w", endpoint, err)
	}
	bound, err := s.GetLastEndpoint()
	if err != nil {
		return "", fmt.Errorf("read bound endpoint of %s: %w", endpoint, err)
	}
	return bound, nil
}

// pubSendFrames sends an optional leading identity frame and then frames
// as one multipart message, never blocking.
func pubSendFrames(s *zmq.Socket, identity []byte, frames [][]byte) error {
	n := len(frames)
	if identity != nil {
		n++
	}
	if n == 0 {
		return errors.New("no frames to send")
	}
	i := 0
	send := func(f []byte) error {
		i++
		flags := zmq.DONTWAIT
		if i < n {
			flags |= zmq.SNDMORE
		}
		_, err := s.SendBytes(f, flags)
		return err
	}
	if identity != nil {
		if err := send(identity); err != nil {
			return err
		}
	}
	for _, f := range frames {
		if err := send(f); err != nil {
			return err
		}
	}
	return nil
}

func pubIsAgain(err error) bool {
	return errors.Is(err, zmq.Errno(syscall.EAGAIN))
}
