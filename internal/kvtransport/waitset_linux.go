//go:build linux

package kvtransport

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// waiter is an epoll instance holding each socket's libzmq signal
// descriptor (ZMQ_FD), itself registered with Go's network poller as a
// file: the epoll descriptor is readable while any socket was signalled.
// libzmq's descriptors only say "look again" (they are reset when libzmq
// takes in its commands, by ready), so every wake-up is confirmed by
// asking the sockets, and a wait parks only after they said no.
type waiter struct {
	ep   *os.File
	epfd int // ep's descriptor, for the non-blocking look of signalled
	rc   syscall.RawConn
	evs  [8]unix.EpollEvent

	// set is the waitSet holding this waiter, whose sockets the check
	// asks; m and err are what the current wait's check found.
	set   *waitSet
	check func(uintptr) bool
	m     uint32
	err   error
}

func (w *waiter) init(set *waitSet) error {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return fmt.Errorf("epoll_create1: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return fmt.Errorf("epoll nonblocking: %w", err)
	}
	w.ep, w.epfd = os.NewFile(uintptr(fd), "kvtransport-waitset"), fd
	// A descriptor Go cannot poll has no deadlines: then there is no way
	// to wait with a timeout.
	if err := w.ep.SetReadDeadline(time.Time{}); err != nil {
		w.ep.Close()
		return fmt.Errorf("epoll descriptor not pollable: %w", err)
	}
	if w.rc, err = w.ep.SyscallConn(); err != nil {
		w.ep.Close()
		return fmt.Errorf("epoll raw conn: %w", err)
	}
	w.set, w.check = set, w.checkSockets
	for _, s := range set.socks {
		if err := w.add(s); err != nil {
			w.ep.Close()
			return err
		}
	}
	return nil
}

func (w *waiter) ctl(op int, fd int) error {
	var cerr error
	err := w.rc.Control(func(ep uintptr) {
		cerr = unix.EpollCtl(int(ep), op, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)})
	})
	if err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("epoll_ctl %d fd %d: %w", op, fd, err)
	}
	return nil
}

// add puts s's signal descriptor in the set and records it in s.fd.
func (w *waiter) add(s *watched) error {
	fd, err := s.GetFd()
	if err != nil {
		return fmt.Errorf("socket descriptor: %w", err)
	}
	s.fd = fd
	return w.ctl(unix.EPOLL_CTL_ADD, fd)
}

// signalled reports, as bits of their index, the sockets whose signal
// descriptor is readable now: one epoll_wait that does not block. The
// descriptors are in the set level-triggered, so looking consumes
// nothing. On failure every socket counts as signalled.
func (w *waiter) signalled() uint32 {
	n, err := unix.EpollWait(w.epfd, w.evs[:], 0)
	if err != nil || n == len(w.evs) {
		return ^uint32(0)
	}
	var m uint32
	for _, ev := range w.evs[:n] {
		for i, s := range w.set.socks {
			if int32(s.fd) == ev.Fd {
				m |= 1 << i
			}
		}
	}
	return m
}

// swap replaces the extra socket old (if any) by s (nil: none).
func (w *waiter) swap(old, s *watched) error {
	if old != nil {
		// The old socket may be closed by now, its descriptor gone from
		// the set with it; that is not an error. The number is removed
		// before any new socket is added, so a reused number is never
		// taken for the old one.
		if err := w.ctl(unix.EPOLL_CTL_DEL, old.fd); err != nil &&
			!errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EBADF) {
			return err
		}
	}
	if s == nil {
		return nil
	}
	return w.add(s)
}

func (w *waiter) wait(timeout time.Duration) (uint32, error) {
	if err := w.ep.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return 0, err
	}
	// Read may end at the deadline without calling the check at all.
	w.m, w.err = 0, nil
	err := w.rc.Read(w.check)
	if w.err != nil {
		return w.m, w.err
	}
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		return w.m, err
	}
	return w.m, nil
}

// checkSockets is the readiness test of a wait: Go's poller calls it
// before parking and after every wake-up. It is made once per waiter
// (w.check), not a closure per wait.
func (w *waiter) checkSockets(uintptr) bool {
	w.m, w.err = w.set.ready()
	return w.m != 0 || w.err != nil
}

func (w *waiter) close() error {
	if w.ep == nil {
		return nil
	}
	err := w.ep.Close()
	w.ep = nil
	return err
}
