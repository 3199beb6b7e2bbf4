package kvtransport

import (
	"errors"
	"fmt"

	zmq "github.com/pebbe/zmq4"
)

// ReplayOptions tunes the snapshot-channel socket.
type ReplayOptions struct {
	// MaxMessageBytes bounds one reply frame (see SubscriberOptions).
	MaxMessageBytes int64
	// ReceiveHWM is the number of replies libzmq queues; past it, it
	// stops reading the connection and the engine's ROUTER queues, then
	// drops, the rest. 0 means 100000.
	ReceiveHWM int
}

// Replayer is a DEALER connected to one engine's ROUTER. One Replayer
// serves one snapshot attempt: a new attempt uses a new Replayer, so a
// late reply to an abandoned request can never be mistaken for the
// current one.
type Replayer struct {
	endpoint string
	dealer   *watched
}

// DialReplay connects a DEALER to endpoint. The connection is made in
// the background; Send fails with ErrNotConnected until it is up.
func (c *Context) DialReplay(endpoint string, o ReplayOptions) (*Replayer, error) {
	d, err := c.newSocket(zmq.DEALER)
	if err != nil {
		return nil, err
	}
	r := &Replayer{endpoint: endpoint, dealer: c.watch(d, true)}
	fail := func(what string, err error) (*Replayer, error) {
		r.Close()
		return nil, fmt.Errorf("kvtransport: replay %s: %s: %w", endpoint, what, err)
	}
	if o.MaxMessageBytes > 0 {
		if err := r.dealer.setMaxMessage(o.MaxMessageBytes); err != nil {
			return fail("set max message size", err)
		}
	}
	hwm := o.ReceiveHWM
	if hwm <= 0 {
		hwm = 100000
	}
	if err := d.SetRcvhwm(hwm); err != nil {
		return fail("set receive hwm", err)
	}
	if err := setImmediate(d); err != nil {
		return fail("set immediate", err)
	}
	if err := d.Connect(endpoint); err != nil {
		return fail("connect", err)
	}
	return r, nil
}

// Endpoint is the address the replayer connects to.
func (r *Replayer) Endpoint() string { return r.endpoint }

// ErrNotConnected is returned by Send while the connection to the
// replay endpoint is not up yet; the caller sends again later.
var ErrNotConnected = errors.New("kvtransport: replay endpoint not connected yet")

// Send hands a request to the connection without waiting for the peer.
// A request is never queued for a connection that does not exist yet
// (see setImmediate): before the link is up Send returns
// ErrNotConnected.
func (r *Replayer) Send(frames [][]byte) error {
	parts := make([]any, len(frames))
	for i, f := range frames {
		parts[i] = f
	}
	_, err := r.dealer.SendMessageDontwait(parts...)
	r.dealer.sent()
	if err != nil {
		if isAgain(err) {
			return ErrNotConnected
		}
		return fmt.Errorf("kvtransport: replay request %s: %w", r.endpoint, err)
	}
	return nil
}

// Recv returns the next reply without waiting, or nil when none is queued.
// Its frames are valid until the next Recv.
func (r *Replayer) Recv() ([][]byte, error) {
	return recvNoWait(r.dealer, "replay")
}

// Close closes the socket, discarding anything still queued.
func (r *Replayer) Close() error {
	if r.dealer == nil {
		return nil
	}
	err := r.dealer.Close()
	r.dealer = nil
	if err != nil {
		return fmt.Errorf("kvtransport: close replay %s: %w", r.endpoint, err)
	}
	return nil
}
