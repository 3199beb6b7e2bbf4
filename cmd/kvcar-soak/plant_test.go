package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/kvcar/kvcar/internal/kvdir"
	"github.com/kvcar/kvcar/internal/kvevent"
	"github.com/kvcar/kvcar/internal/kvtransport"
)

// The deliberately broken parts below exist only in this test binary:
// the program's plant is always the zero one.

// zeroHits is a directory whose every query reports zero hits.
type zeroHits struct{ view }

func (z zeroHits) Query(tokenIDs []uint32, dst []kvdir.Match) []kvdir.Match {
	n := len(dst)
	dst = z.view.Query(tokenIDs, dst)
	for i := n; i < len(dst); i++ {
		dst[i].DeviceHitTokens, dst[i].HostOnlyHitTokens, dst[i].ReusablePrefixTokens = 0, 0, 0
	}
	return dst
}

// keepOldView is a directory whose unsynchronised streams go on
// answering from the view they had: for a prompt it answered while
// synchronised, it reports the hits of then, still flagged
// unsynchronised.
type keepOldView struct {
	view
	mu   sync.Mutex
	last map[oldAnswer]kvdir.Match
}

type oldAnswer struct {
	instance string
	prompt   uint64
}

func newKeepOldView(v view) view { return &keepOldView{view: v, last: map[oldAnswer]kvdir.Match{}} }

func (k *keepOldView) Query(tokenIDs []uint32, dst []kvdir.Match) []kvdir.Match {
	n := len(dst)
	dst = k.view.Query(tokenIDs, dst)
	h := fnv.New64a()
	var buf [4]byte
	for _, t := range tokenIDs {
		binary.LittleEndian.PutUint32(buf[:], t)
		h.Write(buf[:])
	}
	fp := h.Sum64()
	k.mu.Lock()
	defer k.mu.Unlock()
	for i := n; i < len(dst); i++ {
		m := &dst[i]
		key := oldAnswer{m.InstanceName, fp}
		if m.Synchronized {
			if len(k.last) >= 1<<16 {
				clear(k.last)
			}
			k.last[key] = *m
		} else if old, ok := k.last[key]; ok {
			m.DeviceHitTokens, m.HostOnlyHitTokens, m.ReusablePrefixTokens = old.DeviceHitTokens, old.HostOnlyHitTokens, old.ReusablePrefixTokens
		}
	}
	return dst
}

// gapFiller relays an engine's live channel and hides every forward
// sequence gap by sending empty batches under the missing numbers: the
// directory behind it ignores gaps, as one that applied whatever came
// next would. A sequence going back (a restart) passes unchanged.
type gapFiller struct {
	tctx *kvtransport.Context
	sub  *kvtransport.Subscriber
	pub  *kvtransport.Publisher
	stop chan struct{}
	done chan struct{}
}

// maxFill bounds the numbers filled for one gap.
const maxFill = 4096

func newGapFiller(endpoint string) (string, io.Closer, error) {
	tctx, err := kvtransport.NewContext()
	if err != nil {
		return "", nil, err
	}
	g := &gapFiller{tctx: tctx, stop: make(chan struct{}), done: make(chan struct{})}
	if g.pub, err = tctx.BindPublisher("tcp://127.0.0.1:0", kvtransport.PublisherOptions{}); err == nil {
		g.sub, err = tctx.Subscribe(endpoint, "xllm-kv", kvtransport.SubscriberOptions{})
	}
	if err != nil {
		close(g.done)
		return "", nil, errors.Join(err, g.Close())
	}
	go g.run()
	return g.pub.Endpoint(), g, nil
}

func (g *gapFiller) run() {
	defer close(g.done)
	empty := kvevent.AppendBatch(nil, &kvevent.Batch{HasDPRank: true}, kvevent.Shape{})
	var last uint64
	have := false
	for {
		select {
		case <-g.stop:
			return
		default:
		}
		if _, err := g.sub.Wait(nil, 20*time.Millisecond); err != nil {
			return
		}
		for {
			if _, ok, err := g.sub.RecvLink(); !ok || err != nil {
				break
			}
		}
		for {
			frames, err := g.sub.RecvLive()
			if err != nil || frames == nil {
				break
			}
			topic, seq, _, err := kvevent.ParseLive(frames)
			if err == nil && have && seq > last+1 && seq-last-1 <= maxFill {
				for s := last + 1; s < seq; s++ {
					_ = g.pub.Send(kvevent.LiveFrames(string(topic), s, empty))
				}
			}
			_ = g.pub.Send(frames)
			if err == nil {
				last, have = seq, true
			}
		}
		_, _ = g.pub.DrainSubscriptions()
	}
}

func (g *gapFiller) Close() error {
	select {
	case <-g.stop:
		return nil
	default:
	}
	close(g.stop)
	<-g.done
	var errs []error
	if g.sub != nil {
		errs = append(errs, g.sub.Close())
	}
	if g.pub != nil {
		errs = append(errs, g.pub.Close())
	}
	return errors.Join(append(errs, g.tctx.Close())...)
}

// plantRow is one line of the planted-bug table.
func plantRow(name string, r *report) string {
	var kinds []string
	for k := range failKinds {
		if n := r.failures[k]; n > 0 {
			kinds = append(kinds, fmt.Sprintf("%v %d", k, n))
		}
	}
	by := strings.Join(kinds, ", ")
	if by == "" {
		by = "—"
	}
	return fmt.Sprintf("| %s | %d | %s | %d / %d / %d |", name, r.failed(), by, r.checks, r.probes, r.unsyncAnswers)
}
