package main

import (
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"
)

// stallLink forwards one engine's live channel over TCP and can stop
// reading from the engine for a while, as a congested link or a stalled
// subscriber host does. The engine's socket buffers then fill and its
// publisher drops whole messages past its send HWM: real libzmq drops,
// which the directory sees as a sequence gap once the link flows again
// (R-REC-3).
type stallLink struct {
	ln     net.Listener
	target string // the engine's host:port

	mu     sync.Mutex
	open   chan struct{} // closed while data flows; replaced on stall
	conns  map[net.Conn]struct{}
	closed bool
	done   chan struct{}
	wg     sync.WaitGroup
}

// stallRecvBuf is the receive buffer of the link's socket towards the
// engine. Small, so that a stall pushes back on the engine after a few
// messages rather than after the megabytes loopback autotuning allows.
const stallRecvBuf = 16 << 10

// newStallLink listens on a free loopback port and forwards every
// connection to endpoint, a tcp:// address.
func newStallLink(endpoint string) (*stallLink, error) {
	target, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return nil, fmt.Errorf("stall link: endpoint %q is not tcp://", endpoint)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("stall link for %s: %w", endpoint, err)
	}
	l := &stallLink{ln: ln, target: target, open: make(chan struct{}), conns: map[net.Conn]struct{}{}, done: make(chan struct{})}
	close(l.open)
	l.wg.Add(1)
	go l.accept()
	return l, nil
}

// Endpoint is the address subscribers connect to instead of the engine.
func (l *stallLink) Endpoint() string { return "tcp://" + l.ln.Addr().String() }

// Stall stops reading from the engine until Resume.
func (l *stallLink) Stall() {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.open:
		l.open = make(chan struct{})
	default:
	}
}

// Resume lets data flow again.
func (l *stallLink) Resume() {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.open:
	default:
		close(l.open)
	}
}

// Close stops forwarding, closes every connection and waits for the
// link's goroutines.
func (l *stallLink) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.done)
	err := l.ln.Close()
	for c := range l.conns {
		c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
	return err
}

func (l *stallLink) accept() {
	defer l.wg.Done()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.wg.Add(1)
		go l.forward(c)
	}
}

// forward joins one subscriber connection to a new connection to the
// engine; when either side ends, both are closed, so the subscriber sees
// the disconnect an engine restart causes.
func (l *stallLink) forward(sub net.Conn) {
	defer l.wg.Done()
	d := net.Dialer{Timeout: time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, stallRecvBuf)
		}); err != nil {
			return err
		}
		return serr
	}}
	eng, err := d.Dial("tcp", l.target)
	if err != nil {
		sub.Close()
		return
	}
	if !l.track(sub, eng) {
		return
	}
	defer l.untrack(sub, eng)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Subscriptions and heartbeats flow to the engine even while
		// stalled, as on a link congested in one direction.
		_, _ = io.Copy(eng, sub)
		eng.Close()
		sub.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		if !l.wait() {
			break
		}
		n, err := eng.Read(buf)
		if n > 0 {
			if _, werr := sub.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	eng.Close()
	sub.Close()
	wg.Wait()
}

// wait blocks while the link is stalled; false once it is closed.
func (l *stallLink) wait() bool {
	l.mu.Lock()
	open := l.open
	l.mu.Unlock()
	select {
	case <-open:
		return true
	case <-l.done:
		return false
	}
}

func (l *stallLink) track(cs ...net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		l.conns[c] = struct{}{}
	}
	return true
}

func (l *stallLink) untrack(cs ...net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range cs {
		delete(l.conns, c)
	}
}
