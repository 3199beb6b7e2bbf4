package etcdembed

import (
	"fmt"
	"net"
	"sync"
	"time"
)

// relayBufBytes is what one direction of a relayed connection reads at
// a time. During a stall at most this much per direction is held back
// in the relay; the rest waits in the kernel's socket buffers and then
// in the sender's, as it would on a black-holed path.
const relayBufBytes = 32 << 10

// proxy relays the public client port to the server's own client port.
// It exists so that faults can be injected at the network: Stop cuts
// every client connection at once, as an outage does (the server's own
// shutdown waits for open watch streams for its whole request timeout,
// over five seconds, before it gives up), and a stall holds every byte
// back while the connections stay open.
type proxy struct {
	target string

	mu     sync.Mutex
	ln     net.Listener
	relays map[*relay]struct{}
	// quit is closed by shut, so that relays held at the gate give up;
	// each open makes a new one.
	quit chan struct{}
	// flowing is closed while bytes may pass. A stall replaces it by an
	// open channel, which the end of the stall closes.
	flowing chan struct{}
	wg      sync.WaitGroup
}

// relay is one client connection and its connection to the server.
type relay struct {
	client, server net.Conn
	once           sync.Once
	ended          chan struct{} // closed when the relay ends, for either reason
}

// end closes both connections; the copies in both directions return.
func (r *relay) end() {
	r.once.Do(func() {
		close(r.ended)
		r.client.Close()
		r.server.Close()
	})
}

func newProxy(target string) *proxy {
	flowing := make(chan struct{})
	close(flowing)
	return &proxy{target: target, relays: make(map[*relay]struct{}), flowing: flowing}
}

// open listens on addr and relays each connection to the target.
func (p *proxy) open(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("etcdembed: client listener: %w", err)
	}
	p.mu.Lock()
	p.ln = ln
	p.quit = make(chan struct{})
	quit := p.quit
	p.mu.Unlock()
	p.wg.Add(1)
	go p.accept(ln, quit)
	return nil
}

func (p *proxy) accept(ln net.Listener, quit <-chan struct{}) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.relay(c, quit)
	}
}

func (p *proxy) relay(c net.Conn, quit <-chan struct{}) {
	defer p.wg.Done()
	// A connection accepted during a stall is relayed like any other: it
	// is established (the kernel completed its handshake before Accept)
	// and then carries nothing until the stall ends.
	u, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		c.Close()
		return
	}
	r := &relay{client: c, server: u, ended: make(chan struct{})}
	if !p.track(r) {
		r.end()
		return
	}
	var wg sync.WaitGroup
	// Either direction ending ends the relay: closing both connections
	// unblocks the other copy.
	wg.Go(func() { p.copy(r, u, c, quit); r.end() })
	wg.Go(func() { p.copy(r, c, u, quit); r.end() })
	wg.Wait()
	p.untrack(r)
}

// copy relays src to dst until either fails or the relay ends. Bytes
// read during a stall are held until it ends.
func (p *proxy) copy(r *relay, dst, src net.Conn, quit <-chan struct{}) {
	buf := make([]byte, relayBufBytes)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.waitFlowing(r, quit) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// waitFlowing waits until bytes may pass, and reports false if the
// relay ended or the proxy was shut meanwhile.
func (p *proxy) waitFlowing(r *relay, quit <-chan struct{}) bool {
	p.mu.Lock()
	flowing := p.flowing
	p.mu.Unlock()
	select {
	case <-flowing:
		return true
	case <-r.ended:
		return false
	case <-quit:
		return false
	}
}

// stall holds back every byte in both directions, on the connections
// open now and on those accepted later, until unstall.
func (p *proxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.flowing:
		p.flowing = make(chan struct{})
	default: // already stalled
	}
}

// unstall ends a stall. With drop, the connections it held are closed
// first, and the bytes held back with them, so that nothing read during
// the stall reaches the other side; otherwise they carry on and the held
// bytes are delivered.
func (p *proxy) unstall(drop bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if drop {
		for r := range p.relays {
			r.end()
		}
	}
	select {
	case <-p.flowing:
	default:
		close(p.flowing)
	}
}

func (p *proxy) track(r *relay) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		return false
	}
	p.relays[r] = struct{}{}
	return true
}

func (p *proxy) untrack(r *relay) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.relays, r)
}

// shut closes the listener and every relayed connection and waits for
// the relay goroutines to end. A stall outlives it: a proxy opened again
// stays stalled until unstall.
func (p *proxy) shut() {
	p.mu.Lock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
		close(p.quit)
	}
	for r := range p.relays {
		r.end()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
