package kvtransport

import (
	"fmt"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// waitSet waits until any of a few sockets has input. Its sockets are
// the fixed ones it was made with, then at most one extra that the owner
// may swap between waits (a snapshot's replay dealer). wait reports the
// ready sockets as bits of their index. An optional waker ends a wait
// early; the set drains it itself, so it never shows in the bits.
//
// On Linux the wait parks the goroutine in Go's network poller (see
// waitset_linux.go) instead of blocking a thread in libzmq's poll: a
// process following hundreds of streams then runs a handful of threads,
// not one per stream, and a message no longer wakes a thread that must
// win back a CPU from the request path.
type waitSet struct {
	// socks are the waker's receiving end if there is a waker, the
	// fixed sockets, then the extra if any.
	socks []*zmq.Socket
	waker *Waker
	fixed int // the waker's end and the fixed sockets
	waiter
}

// newWaitSet makes a set of socks and, unless it is nil, waker.
func newWaitSet(waker *Waker, socks ...*zmq.Socket) (*waitSet, error) {
	w := &waitSet{waker: waker}
	if waker != nil {
		w.socks = append(w.socks, waker.recv)
	}
	w.socks = append(w.socks, socks...)
	w.fixed = len(w.socks)
	if err := w.waiter.init(w); err != nil {
		return nil, fmt.Errorf("kvtransport: wait set: %w", err)
	}
	return w, nil
}

// setExtra makes s (nil: none) the extra socket, in place of the last.
func (w *waitSet) setExtra(s *zmq.Socket) error {
	var old *zmq.Socket
	if len(w.socks) > w.fixed {
		old = w.socks[w.fixed]
	}
	if old == s {
		return nil
	}
	w.socks = w.socks[:w.fixed]
	if err := w.waiter.swap(old, s); err != nil {
		return fmt.Errorf("kvtransport: wait set: %w", err)
	}
	if s != nil {
		w.socks = append(w.socks, s)
	}
	return nil
}

// ready reports which sockets have input now. Asking libzmq also has it
// take in the commands its I/O thread signalled, which is what re-arms
// a socket's signal descriptor.
func (w *waitSet) ready() (uint32, error) {
	var m uint32
	for i, s := range w.socks {
		ev, err := s.GetEvents()
		if err != nil {
			return m, err
		}
		if ev&zmq.POLLIN != 0 {
			m |= 1 << i
		}
	}
	return m, nil
}

// wait blocks up to timeout until a socket has input, or the waker is
// woken, and reports which sockets have input; none (and no error) when
// the time ran out or a signal cut the wait short. A failed drain of the
// waker is returned with the sockets' bits.
func (w *waitSet) wait(timeout time.Duration) (uint32, error) {
	var m uint32
	var err error
	if timeout <= 0 {
		m, err = w.ready()
	} else {
		// The waiter asks the sockets before it parks: each ask is a
		// cgo call and a system call per socket, so it is not asked
		// here too.
		m, err = w.waiter.wait(timeout)
	}
	if err != nil {
		return 0, wrapPollErr(err)
	}
	if w.waker == nil {
		return m, nil
	}
	if m&1 != 0 {
		if err := w.waker.drain(); err != nil {
			return m >> 1, err
		}
	}
	return m >> 1, nil
}

func wrapPollErr(err error) error {
	if err == nil || isInterrupted(err) {
		return nil
	}
	return fmt.Errorf("poll: %w", err)
}

// close releases what the set holds; the sockets stay open.
func (w *waitSet) close() error { return w.waiter.close() }
