package sockio

import (
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// acceptErr wraps errno as a listener's Accept returns it.
func acceptErr(errno syscall.Errno) error {
	return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", errno)}
}

func TestAcceptRetryable(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED} {
		if !AcceptRetryable(acceptErr(errno)) {
			t.Errorf("%v: not retried", errno)
		}
	}
	if !AcceptRetryable(&net.OpError{Op: "accept", Err: os.ErrDeadlineExceeded}) {
		t.Error("a timeout is not retried")
	}
	// A closed listener, or an error nobody can wait out, ends the loop.
	for _, err := range []error{net.ErrClosed, acceptErr(syscall.EINVAL), errors.New("other")} {
		if AcceptRetryable(err) {
			t.Errorf("%v: retried", err)
		}
	}
	// A real closed listener's error.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	if _, err := ln.Accept(); AcceptRetryable(err) {
		t.Errorf("closed listener's %v: retried", err)
	}
}

func TestAcceptBackoff(t *testing.T) {
	d := time.Duration(0)
	want := []time.Duration{5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond}
	for _, w := range want {
		if d = AcceptBackoff(d); d != w {
			t.Fatalf("backoff %v, want %v", d, w)
		}
	}
	for range 20 {
		d = AcceptBackoff(d)
	}
	if d != time.Second {
		t.Fatalf("backoff capped at %v, want 1s", d)
	}
}
