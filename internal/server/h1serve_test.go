package server

import (
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
)

// serveH1 serves h by an HTTP1Server on loopback until the test ends. It
// returns an httptest.Server whose URL and Client reach it (its own
// net/http server is given a listener that never accepts), so that tests
// written against net/http's server run unchanged against kvcar's.
func serveH1(t *testing.T, h http.Handler, o HTTP1Options) *httptest.Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := NewHTTP1Server(h, o)
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	ts := httptest.NewUnstartedServer(http.NotFoundHandler())
	ts.Listener.Close()
	ts.Listener = &idleListener{addr: ln.Addr(), closed: make(chan struct{})}
	ts.Start()
	t.Cleanup(func() {
		ts.Close()
		hs.Close()
		if err := <-served; err != http.ErrServerClosed {
			t.Errorf("Serve returned %v, want http.ErrServerClosed", err)
		}
	})
	return ts
}

// idleListener has an address and accepts nothing until closed.
type idleListener struct {
	addr   net.Addr
	closed chan struct{}
}

func (l *idleListener) Accept() (net.Conn, error) {
	<-l.closed
	return nil, net.ErrClosed
}

func (l *idleListener) Close() error {
	select {
	case <-l.closed:
	default:
		close(l.closed)
	}
	return nil
}

func (l *idleListener) Addr() net.Addr { return l.addr }
