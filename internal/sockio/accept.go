package sockio

import (
	"errors"
	"log/slog"
	"net"
	"syscall"
	"time"
)

// Accept takes ln's next connection. A failure a server should wait out
// rather than stop serving for (acceptRetryable) is logged and tried
// again after a wait that doubles from 5 ms to a second, as net/http
// waits; any other error is returned at once, as is the last one when
// stop closes during a wait (a nil stop never does). Callers that close
// ln to stop serving see net.ErrClosed.
func Accept(ln net.Listener, stop <-chan struct{}, log *slog.Logger) (net.Conn, error) {
	var wait time.Duration
	for {
		c, err := ln.Accept()
		if err == nil || !acceptRetryable(err) {
			return c, err
		}
		wait = acceptBackoff(wait)
		log.Warn("accepting a connection failed; retrying", "addr", ln.Addr().String(), "err", err, "in", wait)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-stop:
			t.Stop()
			return nil, err
		}
	}
}

// acceptRetryable reports whether a listener's Accept failed for a
// reason a server should wait out rather than stop serving for: out of
// descriptors, buffers or memory, a connection aborted before it was
// taken, or a timeout. Go no longer marks these Temporary, so a loop
// that stops on every error other than a timeout stops on the first
// EMFILE, which a burst of clients can cause.
func acceptRetryable(err error) bool {
	var ne net.Error
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ENOBUFS) ||
		errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.ECONNABORTED) || (errors.As(err, &ne) && ne.Timeout())
}

// acceptBackoff is the wait after an accept failure that follows the
// wait last (0 at first).
func acceptBackoff(last time.Duration) time.Duration {
	return min(max(2*last, 5*time.Millisecond), time.Second)
}
