package etcdembed

import (
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// proxy relays the public client port to the server's own client port.
// It exists so that Stop can cut every client connection at once, as an
// outage does: the server's own shutdown waits for open watch streams
// for its whole request timeout (over five seconds) before it gives up.
type proxy struct {
	target string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func newProxy(target string) *proxy {
	return &proxy{target: target, conns: make(map[net.Conn]struct{})}
}

// open listens on addr and relays each connection to the target.
func (p *proxy) open(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("etcdembed: client listener: %w", err)
	}
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Add(1)
	go p.accept(ln)
	return nil
}

func (p *proxy) accept(ln net.Listener) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.relay(c)
	}
}

func (p *proxy) relay(c net.Conn) {
	defer p.wg.Done()
	u, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		c.Close()
		return
	}
	if !p.track(c, u) {
		c.Close()
		u.Close()
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(u, c)
	go pipe(c, u)
	<-done
	// Either side ending ends the relay: closing both unblocks the other copy.
	c.Close()
	u.Close()
	<-done
	p.untrack(c, u)
}

func (p *proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
	}
}

// shut closes the listener and every relayed connection and waits for
// the relay goroutines to end.
func (p *proxy) shut() {
	p.mu.Lock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
