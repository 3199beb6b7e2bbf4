package baidustd

import (
	"bufio"
	"errors"
	"net"
	"sync"
	"time"
)

// DefaultSniffTimeout bounds the wait for a new connection's first bytes.
const DefaultSniffTimeout = 5 * time.Second

// Mux shares one listener between baidu_std and another protocol (HTTP),
// telling them apart by the first bytes of each connection as brpc does:
// a connection that starts with "PRPC" is served by the Server, any
// other is handed to Listener's Accept. A connection that sends nothing
// within the sniff timeout goes to the other protocol, whose server has
// timeouts of its own.
type Mux struct {
	ln    net.Listener
	rpc   *Server
	sniff time.Duration
	other *muxListener
	wg    sync.WaitGroup // the accept loop and every sniffing goroutine
	once  sync.Once
}

// NewMux serves ln's baidu_std connections with rpc and queues the others
// for Listener. Serve runs the accept loop; Close stops it.
func NewMux(ln net.Listener, rpc *Server, sniffTimeout time.Duration) *Mux {
	if sniffTimeout <= 0 {
		sniffTimeout = DefaultSniffTimeout
	}
	return &Mux{ln: ln, rpc: rpc, sniff: sniffTimeout, other: &muxListener{
		addr: ln.Addr(), conns: make(chan net.Conn), closed: make(chan struct{}),
	}}
}

// Listener is the listener of the connections that are not baidu_std.
func (m *Mux) Listener() net.Listener { return m.other }

// Serve accepts until Close or an accept error, which it returns
// (net.ErrClosed after Close).
func (m *Mux) Serve() error {
	m.wg.Add(1)
	defer m.wg.Done()
	for {
		c, err := m.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			m.other.close()
			return err
		}
		m.wg.Add(1)
		go m.route(c)
	}
}

// route reads the first bytes of c without consuming them and hands c
// to the protocol they name.
func (m *Mux) route(c net.Conn) {
	defer m.wg.Done()
	r := bufio.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(m.sniff))
	head, _ := r.Peek(len(Magic))
	_ = c.SetReadDeadline(time.Time{})
	if len(head) == len(Magic) && IsMagic(head) {
		m.rpc.serveConn(c, r)
		return
	}
	select {
	case m.other.conns <- &peekedConn{Conn: c, r: r}:
	case <-m.other.closed:
		c.Close()
	}
}

// Close closes the listener and the other protocol's listener, and waits
// for the connections being sniffed. Connections already handed over
// belong to their servers.
func (m *Mux) Close() error {
	var err error
	m.once.Do(func() { err = m.ln.Close() })
	m.other.close()
	m.wg.Wait()
	return err
}

// muxListener hands the non-baidu_std connections to their server.
type muxListener struct {
	addr   net.Addr
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func (l *muxListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *muxListener) close() { l.once.Do(func() { close(l.closed) }) }

func (l *muxListener) Close() error {
	l.close()
	return nil
}

func (l *muxListener) Addr() net.Addr { return l.addr }

// peekedConn is a connection whose first bytes were read ahead into r.
type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *peekedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
