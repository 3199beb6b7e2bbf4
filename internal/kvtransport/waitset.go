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
	socks []*watched
	waker *Waker
	fixed int // the waker's end and the fixed sockets
	// asks counts the sockets asked for their events, for tests.
	asks uint64
	waiter
}

// watched is a socket as the wait sets and its owner share it: what is
// known of its input, so that a wait asks libzmq only about the sockets
// that may have some. Asking (ZMQ_EVENTS) costs a cgo call and two system
// calls per socket (libzmq checks its signal descriptor with poll, and
// for a fork with getpid), which with four sockets a stream was most of
// what a stream's wake-up cost.
type watched struct {
	*zmq.Socket
	// fd is the socket's ZMQ_FD once it is in a set (Linux).
	fd int
	// tracked: the owner does everything to the socket through watched's
	// methods (recv, sent), so empty can be trusted. A socket that is
	// also sent on or read directly is not tracked and is always asked.
	tracked bool
	// empty: the last look at the socket (an ask or a receive) found no
	// input and nothing was done to it since. libzmq's reader is then
	// asleep, so the writer of any new input sends it a command, which
	// makes fd readable: until fd is, there is nothing to ask about.
	empty bool
	// fr receives the socket's messages into storage it reuses.
	fr frameReader
}

func watch(s *zmq.Socket, tracked bool) *watched {
	return &watched{Socket: s, fd: -1, tracked: tracked}
}

// recv receives one multipart message without waiting: nil when none
// is queued, which also makes the socket known empty. The frames are
// valid until the next recv.
func (s *watched) recv() ([][]byte, error) {
	frames, err := s.fr.recv(s.Socket)
	s.seen(err)
	if err != nil && isAgain(err) {
		return nil, nil
	}
	return frames, err
}

// Close closes the socket and frees what its receives held.
func (s *watched) Close() error {
	s.fr.drop()
	return s.Socket.Close()
}

// seen records what a receive found: nothing (EAGAIN) or something.
func (s *watched) seen(err error) { s.empty = err != nil && isAgain(err) }

// sent records a send: libzmq may have taken in commands, among them one
// that makes input readable, so the socket must be asked again.
func (s *watched) sent() { s.empty = false }

// newWaitSet makes a set of socks and, unless it is nil, waker.
func newWaitSet(waker *Waker, socks ...*watched) (*waitSet, error) {
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
func (w *waitSet) setExtra(s *watched) error {
	var old *watched
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
// a socket's signal descriptor. A tracked socket known empty is asked
// only when its descriptor says libzmq signalled it since.
func (w *waitSet) ready() (uint32, error) {
	skippable := false
	for _, s := range w.socks {
		skippable = skippable || s.tracked && s.empty
	}
	signalled := ^uint32(0)
	if skippable {
		signalled = w.waiter.signalled()
	}
	var m uint32
	for i, s := range w.socks {
		if s.tracked && s.empty && signalled&(1<<i) == 0 {
			continue
		}
		w.asks++
		ev, err := s.GetEvents()
		if err != nil {
			s.empty = false
			return m, err
		}
		s.empty = ev&zmq.POLLIN == 0
		if !s.empty {
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
