package kvtransport

import (
	"errors"
	"fmt"

	zmq "github.com/pebbe/zmq4"
)

// ErrTimeout is returned when a wait ends without a message.
var ErrTimeout = errors.New("kvtransport: timed out")

// Context owns one libzmq context. Sockets made from it must be closed
// before Close is called.
type Context struct {
	zctx *zmq.Context
	ids  idSource
	// bufs are receive buffers its sockets gave back (frameReader).
	bufs bufferPool
	// ioPolicy says why the I/O threads run under the normal policy;
	// nil when they run under SCHED_BATCH (see startIOThreads).
	ioPolicy error
}

// NewContext creates a libzmq context and starts its I/O thread.
func NewContext() (*Context, error) {
	zctx, err := zmq.NewContext()
	if err != nil {
		return nil, fmt.Errorf("kvtransport: new context: %w", err)
	}
	c := &Context{zctx: zctx}
	if err := startIOThreads(zctx); err != nil {
		if errors.Is(err, errStart) {
			_ = zctx.Term()
			return nil, err
		}
		c.ioPolicy = err
	}
	return c, nil
}

// IOThreadsYield reports nil when the context's I/O threads never
// preempt a running thread (they run under SCHED_BATCH), and otherwise
// why they do.
func (c *Context) IOThreadsYield() error { return c.ioPolicy }

// Close terminates the context. It blocks until every socket made from it
// has been closed; sockets are created with LINGER 0 so that is prompt.
func (c *Context) Close() error {
	if err := c.zctx.Term(); err != nil {
		return fmt.Errorf("kvtransport: terminate context: %w", err)
	}
	return nil
}

// nextID returns a number unique within this context, for inproc names.
func (c *Context) nextID() uint64 { return c.ids.next() }

// newSocket creates a socket with the options every KV channel socket
// shares: no linger on close, so a closing stream never waits for a peer.
func (c *Context) newSocket(t zmq.Type) (*zmq.Socket, error) {
	s, err := c.zctx.NewSocket(t)
	if err != nil {
		return nil, fmt.Errorf("kvtransport: new %v socket: %w", t, err)
	}
	if err := s.SetLinger(0); err != nil {
		s.Close()
		return nil, fmt.Errorf("kvtransport: set linger: %w", err)
	}
	return s, nil
}

// watch wraps a socket of c whose receives share c's buffer pool.
func (c *Context) watch(s *zmq.Socket, tracked bool) *watched {
	w := watch(s, tracked)
	w.fr.pool = &c.bufs
	return w
}

// errStart marks a failure to start the I/O threads at all, as opposed
// to starting them under the normal policy.
var errStart = errors.New("kvtransport: start I/O threads")
