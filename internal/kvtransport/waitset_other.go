//go:build !linux

package kvtransport

import (
	"time"

	zmq "github.com/pebbe/zmq4"
)

// waiter is libzmq's poll over the set's sockets, the extra socket
// swapped in and out of it.
type waiter struct {
	set *waitSet
	p   *zmq.Poller
}

func (w *waiter) init(set *waitSet) error {
	w.set, w.p = set, zmq.NewPoller()
	for _, s := range set.socks {
		w.p.Add(s.Socket, zmq.POLLIN)
	}
	return nil
}

func (w *waiter) swap(old, s *watched) error {
	if old != nil {
		// A socket closed since is not in the poll any more.
		_ = w.p.RemoveBySocket(old.Socket)
	}
	if s != nil {
		w.p.Add(s.Socket, zmq.POLLIN)
	}
	return nil
}

// signalled does not know which sockets were signalled: all may have been.
func (w *waiter) signalled() uint32 { return ^uint32(0) }

func (w *waiter) wait(timeout time.Duration) (uint32, error) {
	if _, err := w.p.Poll(timeout); err != nil {
		return 0, err
	}
	return w.set.ready()
}

func (w *waiter) close() error { return nil }
