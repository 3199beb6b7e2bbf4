package sockio

import (
	"errors"
	"log/slog"
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
		if !acceptRetryable(acceptErr(errno)) {
			t.Errorf("%v: not retried", errno)
		}
	}
	if !acceptRetryable(&net.OpError{Op: "accept", Err: os.ErrDeadlineExceeded}) {
		t.Error("a timeout is not retried")
	}
	// A closed listener, or an error nobody can wait out, ends the loop.
	for _, err := range []error{net.ErrClosed, acceptErr(syscall.EINVAL), errors.New("other")} {
		if acceptRetryable(err) {
			t.Errorf("%v: retried", err)
		}
	}
	// A real closed listener's error.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	if _, err := ln.Accept(); acceptRetryable(err) {
		t.Errorf("closed listener's %v: retried", err)
	}
}

func TestAcceptBackoff(t *testing.T) {
	d := time.Duration(0)
	want := []time.Duration{5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond}
	for _, w := range want {
		if d = acceptBackoff(d); d != w {
			t.Fatalf("backoff %v, want %v", d, w)
		}
	}
	for range 20 {
		d = acceptBackoff(d)
	}
	if d != time.Second {
		t.Fatalf("backoff capped at %v, want 1s", d)
	}
}

// failingListener is a real TCP listener whose Accept first fails with
// errno, as many times as fails says.
type failingListener struct {
	net.Listener
	errno syscall.Errno
	fails int
}

func (l *failingListener) Accept() (net.Conn, error) {
	if l.fails > 0 {
		l.fails--
		return nil, acceptErr(l.errno)
	}
	return l.Listener.Accept()
}

// TestAcceptWaitsOutEMFILE: Accept survives descriptors running out and
// returns the connection that comes after; a closed stop ends the waits
// with the failure; other errors return at once.
func TestAcceptWaitsOutEMFILE(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	log := slog.New(slog.DiscardHandler)
	ln := &failingListener{Listener: tcp, errno: syscall.EMFILE, fails: 3}
	client, err := net.Dial("tcp", tcp.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	c, err := Accept(ln, nil, log)
	if err != nil || ln.fails != 0 {
		t.Fatalf("Accept = %v, %v after %d failures left", c, err, ln.fails)
	}
	c.Close()

	stop := make(chan struct{})
	close(stop)
	ln.fails = 1 << 30
	if _, err := Accept(ln, stop, log); !errors.Is(err, syscall.EMFILE) {
		t.Fatalf("Accept with stop closed = %v, want EMFILE", err)
	}
	tcp.Close()
	ln.fails = 0
	if _, err := Accept(ln, nil, log); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept on a closed listener = %v, want net.ErrClosed", err)
	}
}
