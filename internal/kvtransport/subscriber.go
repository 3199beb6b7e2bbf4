package kvtransport

import (
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// LinkEvent reports a change of the TCP link under a subscriber.
type LinkEvent uint8

const (
	// LinkConnected means a connection to the publisher is up; libzmq has
	// (re)sent the subscription on it.
	LinkConnected LinkEvent = iota + 1
	// LinkDisconnected means the connection dropped; libzmq keeps
	// reconnecting in the background and anything published meanwhile is
	// lost.
	LinkDisconnected
)

func (e LinkEvent) String() string {
	switch e {
	case LinkConnected:
		return "connected"
	case LinkDisconnected:
		return "disconnected"
	}
	return "unknown"
}

// SubscriberOptions tunes the live-channel socket.
type SubscriberOptions struct {
	// MaxMessageBytes bounds one frame. libzmq drops the connection of a
	// peer that sends a larger frame instead of allocating for it, and a
	// receive drops a message whose frames add up to more than it and
	// FrameSlack (ErrMessageTooLarge).
	MaxMessageBytes int64
	// ReceiveHWM is the number of messages libzmq queues before it drops.
	ReceiveHWM int
	// ReconnectInterval and ReconnectIntervalMax bound the reconnect
	// backoff after the publisher goes away.
	ReconnectInterval    time.Duration
	ReconnectIntervalMax time.Duration
	// Heartbeat enables ZMTP pings so a silently dead peer is noticed.
	Heartbeat time.Duration
	// Waker, when set, ends a Wait early; the owner wakes it to stop.
	// The subscriber only reads it and never closes it.
	Waker *Waker
}

func (o SubscriberOptions) withDefaults() SubscriberOptions {
	if o.ReceiveHWM <= 0 {
		o.ReceiveHWM = 10000
	}
	if o.ReconnectInterval <= 0 {
		o.ReconnectInterval = 100 * time.Millisecond
	}
	if o.ReconnectIntervalMax <= 0 {
		o.ReconnectIntervalMax = 5 * time.Second
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = time.Second
	}
	return o
}

// Subscriber is a SUB socket connected to one engine's XPUB, plus a
// monitor that turns connection changes into LinkEvents.
type Subscriber struct {
	endpoint string
	sub      *watched
	mon      *watched
	ws       *waitSet
	waker    *Waker // nil without SubscriberOptions.Waker
}

// Subscribe connects a SUB socket to endpoint and subscribes to topic.
// The connection is made in the background: a publisher that is not up
// yet is retried with backoff, and a restarted one is rejoined. The
// subscription reaches the publisher from the first Wait or receive
// after the connection completes, so the owner must keep polling.
func (c *Context) Subscribe(endpoint, topic string, o SubscriberOptions) (*Subscriber, error) {
	o = o.withDefaults()
	sub, err := c.newSocket(zmq.SUB)
	if err != nil {
		return nil, err
	}
	s := &Subscriber{endpoint: endpoint, sub: c.watch(sub, true), waker: o.Waker}
	fail := func(what string, err error) (*Subscriber, error) {
		s.Close()
		return nil, fmt.Errorf("kvtransport: subscribe %s: %s: %w", endpoint, what, err)
	}
	if o.MaxMessageBytes > 0 {
		if err := s.sub.setMaxMessage(o.MaxMessageBytes); err != nil {
			return fail("set max message size", err)
		}
	}
	if err := sub.SetRcvhwm(o.ReceiveHWM); err != nil {
		return fail("set receive hwm", err)
	}
	if err := setImmediate(sub); err != nil {
		return fail("set immediate", err)
	}
	if err := sub.SetReconnectIvl(o.ReconnectInterval); err != nil {
		return fail("set reconnect interval", err)
	}
	if err := sub.SetReconnectIvlMax(o.ReconnectIntervalMax); err != nil {
		return fail("set reconnect interval max", err)
	}
	if err := sub.SetHeartbeatIvl(o.Heartbeat); err != nil {
		return fail("set heartbeat", err)
	}
	if err := sub.SetHeartbeatTimeout(3 * o.Heartbeat); err != nil {
		return fail("set heartbeat timeout", err)
	}
	if err := sub.SetSubscribe(topic); err != nil {
		return fail("set subscribe", err)
	}
	// The monitor must be attached before connect so the first
	// CONNECTED event is not missed.
	monAddr := fmt.Sprintf("inproc://kvtransport-monitor-%d", c.nextID())
	if err := sub.Monitor(monAddr, zmq.EVENT_CONNECTED|zmq.EVENT_DISCONNECTED); err != nil {
		return fail("monitor", err)
	}
	mon, err := c.newSocket(zmq.PAIR)
	if err != nil {
		return fail("monitor socket", err)
	}
	s.mon = watch(mon, true)
	if err := mon.Connect(monAddr); err != nil {
		return fail("connect monitor", err)
	}
	if err := sub.Connect(endpoint); err != nil {
		return fail("connect", err)
	}
	if s.ws, err = newWaitSet(s.waker, s.sub, s.mon); err != nil {
		return fail("wait set", err)
	}
	return s, nil
}

// Endpoint is the address the subscriber connects to.
func (s *Subscriber) Endpoint() string { return s.endpoint }

// Close closes both sockets. It never blocks on the peer.
func (s *Subscriber) Close() error {
	var errs []error
	if s.ws != nil {
		errs = append(errs, s.ws.close())
		s.ws = nil
	}
	if s.sub != nil {
		// Stop the monitor first so its PAIR does not see a half-closed peer.
		_ = s.sub.Monitor("", 0)
		errs = append(errs, s.sub.Close())
		s.sub = nil
	}
	if s.mon != nil {
		errs = append(errs, s.mon.Close())
		s.mon = nil
	}
	return errors.Join(errs...)
}

// RecvLive returns the next live message without waiting, or nil when
// none is queued. Its frames are valid until the next RecvLive.
func (s *Subscriber) RecvLive() ([][]byte, error) {
	return recvNoWait(s.sub, "live")
}

// RecvLink returns the next link event without waiting; ok is false when
// none is queued.
func (s *Subscriber) RecvLink() (ev LinkEvent, ok bool, err error) {
	et, _, _, err := s.mon.RecvEvent(zmq.DONTWAIT)
	s.mon.seen(err)
	if err != nil {
		if isAgain(err) {
			return 0, false, nil
		}
		return 0, false, fmt.Errorf("kvtransport: monitor %s: %w", s.endpoint, err)
	}
	switch {
	case et&zmq.EVENT_CONNECTED != 0:
		return LinkConnected, true, nil
	case et&zmq.EVENT_DISCONNECTED != 0:
		return LinkDisconnected, true, nil
	}
	return 0, false, nil
}

// Ready says which inputs have something to read after a Wait.
type Ready struct {
	Live, Link, Replay bool
}

// Any reports whether anything is readable.
func (r Ready) Any() bool { return r.Live || r.Link || r.Replay }

// Wait blocks up to timeout until the subscriber, its monitor or the
// optional replayer r has input, or the subscriber's waker is woken.
func (s *Subscriber) Wait(r *Replayer, timeout time.Duration) (Ready, error) {
	var extra *watched
	if r != nil {
		extra = r.dealer
	}
	if err := s.ws.setExtra(extra); err != nil {
		return Ready{}, fmt.Errorf("kvtransport: wait %s: %w", s.endpoint, err)
	}
	m, err := s.ws.wait(timeout)
	rd := Ready{Live: m&(1<<0) != 0, Link: m&(1<<1) != 0, Replay: m&(1<<2) != 0}
	if err != nil {
		return rd, fmt.Errorf("kvtransport: wait %s: %w", s.endpoint, err)
	}
	return rd, nil
}

// setImmediate makes libzmq drop a connection's queue with the
// connection instead of handing it to the next one. Without it, a queue
// that was full when the link dropped is still attached after the
// reconnect, and reading from it wakes the new connection's input that
// was never stopped: libzmq 4.3 then aborts the process on
// "Assertion failed: _input_stopped (stream_engine_base.cpp)"
// (zeromq/libzmq#3937), seen here when a stalled subscriber outlived the
// heartbeat timeout. kvtransport's users treat a disconnect as the loss
// of everything in flight anyway.
func setImmediate(s *zmq.Socket) error { return s.SetImmediate(true) }

func recvNoWait(s *watched, what string) ([][]byte, error) {
	frames, err := s.recv()
	if err != nil {
		return nil, fmt.Errorf("kvtransport: receive %s: %w", what, err)
	}
	return frames, nil
}

func isAgain(err error) bool {
	return zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN)
}

func isInterrupted(err error) bool {
	return zmq.AsErrno(err) == zmq.Errno(syscall.EINTR)
}

// idSource hands out process-unique suffixes for inproc addresses.
type idSource struct{ n atomic.Uint64 }

func (i *idSource) next() uint64 { return i.n.Add(1) }
