package kvtransport

import (
	"errors"
	"fmt"
	"sync"

	zmq "github.com/pebbe/zmq4"
)

// Waker lets any goroutine end the wait of the goroutine that owns a set
// of sockets, which cannot select on a Go channel: a pair of inproc
// sockets whose receiving end is polled with the owner's sockets. The
// sending end is shared under a lock, which also gives libzmq the memory
// barrier a socket needs to change threads.
type Waker struct {
	mu   sync.Mutex
	send *zmq.Socket // nil once closed
	recv *watched
}

// NewWaker creates a waker. Every wake is queued until the owner drains
// them: a bounded queue would refuse a wake whenever the sender had not
// yet taken in that the owner emptied it (libzmq updates a sender's view
// of the queue lazily), and the refused wake would be lost.
func (c *Context) NewWaker() (*Waker, error) {
	addr := fmt.Sprintf("inproc://kvtransport-waker-%d", c.nextID())
	recv, err := c.newSocket(zmq.PULL)
	if err != nil {
		return nil, err
	}
	send, err := c.newSocket(zmq.PUSH)
	if err != nil {
		recv.Close()
		return nil, err
	}
	w := &Waker{send: send, recv: watch(recv, true)}
	fail := func(what string, err error) (*Waker, error) {
		w.Close()
		return nil, fmt.Errorf("kvtransport: waker: %s: %w", what, err)
	}
	if err := recv.SetRcvhwm(0); err != nil {
		return fail("set receive hwm", err)
	}
	if err := send.SetSndhwm(0); err != nil {
		return fail("set send hwm", err)
	}
	if err := recv.Bind(addr); err != nil {
		return fail("bind", err)
	}
	if err := send.Connect(addr); err != nil {
		return fail("connect", err)
	}
	return w, nil
}

// Wake ends the owner's current or next wait. It never blocks; waking a
// closed waker does nothing.
func (w *Waker) Wake() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.send == nil {
		return nil
	}
	if _, err := w.send.SendBytes(nil, zmq.DONTWAIT); err != nil {
		return fmt.Errorf("kvtransport: wake: %w", err)
	}
	return nil
}

// drain takes every pending wake; only the owner calls it.
func (w *Waker) drain() error {
	for {
		_, err := w.recv.RecvBytes(zmq.DONTWAIT)
		w.recv.seen(err)
		if err != nil {
			if isAgain(err) {
				return nil
			}
			return fmt.Errorf("kvtransport: waker drain: %w", err)
		}
	}
}

// Close closes both ends; the owner calls it once its waits are over.
func (w *Waker) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	var errs []error
	if w.send != nil {
		errs = append(errs, w.send.Close())
		w.send = nil
	}
	if w.recv != nil {
		errs = append(errs, w.recv.Close())
		w.recv = nil
	}
	return errors.Join(errs...)
}
