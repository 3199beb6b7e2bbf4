package kvtransport

import (
	"errors"
	"fmt"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// BoundSubscriber is a SUB socket that binds and lets publishers dial
// it: the convention of llm-d, where every engine's PUB connects to one
// subscriber, and what a vLLM publisher does with a non-wildcard
// endpoint. It receives every topic; telling the engines apart is the
// owner's business.
type BoundSubscriber struct {
	sock      *watched
	endpoints []string
	ws        *waitSet
	waker     *Waker
}

// BindSubscriber binds one SUB socket on every endpoint (wildcard hosts
// allowed) and subscribes to every topic. MaxMessageBytes and ReceiveHWM
// bound what a publisher can make it hold, as for Subscribe; the waker
// ends a Wait early.
func (c *Context) BindSubscriber(endpoints []string, o SubscriberOptions) (*BoundSubscriber, error) {
	if len(endpoints) == 0 {
		return nil, errors.New("kvtransport: bound subscriber: no endpoint")
	}
	o = o.withDefaults()
	sock, err := c.newSocket(zmq.SUB)
	if err != nil {
		return nil, err
	}
	b := &BoundSubscriber{sock: c.watch(sock, true), waker: o.Waker}
	fail := func(what string, err error) (*BoundSubscriber, error) {
		b.Close()
		return nil, fmt.Errorf("kvtransport: bound subscriber %v: %s: %w", endpoints, what, err)
	}
	if o.MaxMessageBytes > 0 {
		if err := b.sock.setMaxMessage(o.MaxMessageBytes); err != nil {
			return fail("set max message size", err)
		}
	}
	if err := sock.SetRcvhwm(o.ReceiveHWM); err != nil {
		return fail("set receive hwm", err)
	}
	if err := setImmediate(sock); err != nil {
		return fail("set immediate", err)
	}
	if err := sock.SetHeartbeatIvl(o.Heartbeat); err != nil {
		return fail("set heartbeat", err)
	}
	if err := sock.SetHeartbeatTimeout(3 * o.Heartbeat); err != nil {
		return fail("set heartbeat timeout", err)
	}
	if err := sock.SetSubscribe(""); err != nil {
		return fail("set subscribe", err)
	}
	for _, ep := range endpoints {
		bound, err := routerBind(sock, ep)
		if err != nil {
			return fail("bind", err)
		}
		b.endpoints = append(b.endpoints, bound)
	}
	if b.ws, err = newWaitSet(b.waker, b.sock); err != nil {
		return fail("wait set", err)
	}
	return b, nil
}

// Endpoints are the endpoints bound, with the real ports.
func (b *BoundSubscriber) Endpoints() []string { return b.endpoints }

// Wait blocks up to timeout until a message is queued or the waker was
// woken, and reports whether a message is queued.
func (b *BoundSubscriber) Wait(timeout time.Duration) (bool, error) {
	m, err := b.ws.wait(timeout)
	if err != nil {
		return m&1 != 0, fmt.Errorf("kvtransport: bound subscriber: %w", err)
	}
	return m&1 != 0, nil
}

// Recv returns the next message without waiting, or nil when none is
// queued. Its frames are valid until the next Recv.
func (b *BoundSubscriber) Recv() ([][]byte, error) {
	return recvNoWait(b.sock, "bound live")
}

// Close closes the socket.
func (b *BoundSubscriber) Close() error {
	if b.ws != nil {
		_ = b.ws.close() // only its own epoll descriptor; the socket's close says more
		b.ws = nil
	}
	if b.sock == nil {
		return nil
	}
	err := b.sock.Close()
	b.sock = nil
	if err != nil {
		return fmt.Errorf("kvtransport: close bound subscriber: %w", err)
	}
	return nil
}

// DialPublisher makes an engine's live channel that connects to a bound
// subscriber instead of binding, as vLLM does with an endpoint whose host
// is not a wildcard. Send never blocks: past the send HWM, or while the
// connection is down, messages are dropped, which the subscriber sees as
// a gap.
func (c *Context) DialPublisher(endpoint string, o PublisherOptions) (*Publisher, error) {
	s, err := c.newSocket(zmq.XPUB)
	if err != nil {
		return nil, fmt.Errorf("kvtransport: dialing publisher: %w", err)
	}
	hwm := o.SendHWM
	if hwm <= 0 {
		hwm = DefaultSendHWM
	}
	fail := func(what string, err error) (*Publisher, error) {
		s.Close()
		return nil, fmt.Errorf("kvtransport: dialing publisher %s: %s: %w", endpoint, what, err)
	}
	if err := s.SetSndhwm(hwm); err != nil {
		return fail("set send hwm", err)
	}
	if err := s.SetXpubVerbose(1); err != nil {
		return fail("set verbose", err)
	}
	if err := s.SetReconnectIvl(100 * time.Millisecond); err != nil {
		return fail("set reconnect interval", err)
	}
	if err := s.Connect(endpoint); err != nil {
		return fail("connect", err)
	}
	return &Publisher{sock: s, endpoint: endpoint}, nil
}
