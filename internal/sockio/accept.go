package sockio

import (
	"errors"
	"net"
	"syscall"
	"time"
)

// AcceptRetryable reports whether a listener's Accept failed for a
// reason a server should wait out rather than stop serving for: out of
// descriptors, buffers or memory, a connection aborted before it was
// taken, or a timeout. Go no longer marks these Temporary, so a loop
// that stops on every error other than a timeout stops on the first
// EMFILE, which a burst of clients can cause.
func AcceptRetryable(err error) bool {
	var ne net.Error
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ENOBUFS) ||
		errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.ECONNABORTED) || (errors.As(err, &ne) && ne.Timeout())
}

// AcceptBackoff is the wait after an accept failure that follows the
// wait last (0 after a success): doubling from 5 ms up to a second, as
// net/http waits.
func AcceptBackoff(last time.Duration) time.Duration {
	return min(max(2*last, 5*time.Millisecond), time.Second)
}
