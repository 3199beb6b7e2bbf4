package kvdir

import (
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/kvcar/kvcar/internal/config"
	"github.com/kvcar/kvcar/internal/kvtransport"
)

// hub serves the bound-subscriber mode: it owns one SUB socket bound on a
// range of ports that every engine's publisher dials, and relays each
// message unchanged to a publisher on a loopback port, where the streams
// sharing the bound socket subscribe, each to its own topic. Each stream
// then runs exactly as if it were connected to its engine: its own
// socket, link events, receive HWM and sequence checks; a message a slow
// stream cannot take is dropped for it alone and shows as a gap.
//
// What the relay cannot tell a stream is that its engine's connection
// dropped: one link carries many engines. A restarted engine shows as its
// sequence going back, and a discovered one as a new incarnation.
type hub struct {
	key   hubKey
	relay string // loopback endpoint the streams connect to
	refs  int    // streams using the hub; changed under Directory.mu

	sub   *kvtransport.BoundSubscriber
	pub   *kvtransport.Publisher
	waker *kvtransport.Waker
	log   *slog.Logger

	stop chan struct{}
	done chan struct{}

	relayed atomic.Uint64
	failed  atomic.Uint64
	// subscriptions counts subscribe requests the relay has seen: one per
	// stream connection.
	subscriptions atomic.Uint64
}

// hubKey names a bound subscriber: its first address and port count.
type hubKey struct {
	bind  string
	ports int
}

// startHub binds the subscriber and the relay and starts the relay
// goroutine, which owns both sockets from then on.
func (d *Directory) startHub(k hubKey) (*hub, error) {
	w, err := d.tctx.NewWaker()
	if err != nil {
		return nil, fmt.Errorf("kvdir: hub %s: %w", k.bind, err)
	}
	sub, err := d.tctx.BindSubscriber(config.BindPorts(k.bind, k.ports), kvtransport.SubscriberOptions{
		MaxMessageBytes: int64(d.lim.MaxMessageBytes),
		ReceiveHWM:      d.lim.receiveHWM(),
		Waker:           w,
	})
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("kvdir: hub: %w", err)
	}
	pub, err := d.tctx.BindPublisher("tcp://127.0.0.1:0", kvtransport.PublisherOptions{SendHWM: d.lim.receiveHWM()})
	if err != nil {
		sub.Close()
		w.Close()
		return nil, fmt.Errorf("kvdir: hub relay: %w", err)
	}
	h := &hub{key: k, relay: pub.Endpoint(), sub: sub, pub: pub, waker: w, log: d.log,
		stop: make(chan struct{}), done: make(chan struct{})}
	d.log.Info("bound subscriber listening", "endpoints", sub.Endpoints(), "relay", h.relay)
	go h.run()
	return h, nil
}

func (h *hub) run() {
	defer close(h.done)
	defer func() {
		for _, err := range []error{h.sub.Close(), h.pub.Close(), h.waker.Close()} {
			if err != nil {
				h.log.Debug("close hub socket", "err", err)
			}
		}
	}()
	for {
		select {
		case <-h.stop:
			return
		default:
		}
		if _, err := h.sub.Wait(pollInterval); err != nil {
			h.log.Warn("bound subscriber wait failed", "err", err)
		}
		for range drainMax {
			frames, err := h.sub.Recv()
			if err != nil {
				h.log.Warn("bound subscriber receive failed", "err", err)
				break
			}
			if frames == nil {
				break
			}
			if err := h.pub.Send(frames); err != nil {
				if h.failed.Add(1) == 1 {
					h.log.Warn("relay to streams failed", "err", err)
				}
				continue
			}
			h.relayed.Add(1)
		}
		if n, err := h.pub.DrainSubscriptions(); err != nil {
			h.log.Debug("hub relay subscriptions", "err", err)
		} else {
			h.subscriptions.Store(n)
		}
	}
}

func (h *hub) close() {
	close(h.stop)
	_ = h.waker.Wake()
	<-h.done
}
