package main

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/kvdir"
)

// TestStallMakesThePublisherDrop_RREC3: a stall of the link while the
// engine publishes a burst makes the engine's XPUB drop past its send HWM
// (a real libzmq drop: the engine sent every message), the stream
// notices the gap once the link flows again, and recovers to the
// engine's exact state.
func TestStallMakesThePublisherDrop_RREC3(t *testing.T) {
	quiet := slog.New(slog.DiscardHandler)
	const bs = 16
	dir, err := kvdir.New(kvdir.Limits{MaxBlocksPerStream: 8192, MaxMessageBytes: 1 << 20, MaxBufferedBytes: 4 << 20,
		ReplayTimeout: replayTimeout, ResyncInterval: time.Minute}, kvdir.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	e, err := enginesim.New(enginesim.Config{Name: "127.0.0.1:9000", BlockSize: bs, DeviceBlocks: deviceBlocks, HostBlocks: hostBlocks,
		Topic: "xllm-kv", Logger: quiet, SendHWM: liveSendHWM, ReplaySendHWM: enginesim.DefaultSendHWM})
	if err == nil {
		err = e.Start()
	}
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	link, err := newStallLink(e.EventEndpoint(0))
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	if err := dir.SetStreams([]kvdir.StreamSpec{{InstanceName: e.Name(), Endpoint: link.Endpoint(),
		ReplayEndpoint: e.ReplayEndpoint(0), Topic: "xllm-kv", BlockSize: bs, HashSeed: 1024}}); err != nil {
		t.Fatal(err)
	}
	en := &engine{e: e, link: link}
	o := options{blockSize: bs}
	r := &report{}
	c := &checker{ctx: context.Background(), v: dir, o: o, r: r, rng: rand.New(rand.NewPCG(1, 2))}
	// The subscription has reached the engine: what it publishes now is
	// for the stream to receive or to miss as a gap.
	for e.Subscriptions(0) == 0 {
		if err := c.prefill(en); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := c.prefill(en); err != nil {
		t.Fatal(err)
	}
	if !c.caughtUp(en) {
		t.Fatal("the stream did not catch up before the stall")
	}
	before, _ := streamOf(dir, e.Name())
	sent := e.Seq(0)
	if err := stall(context.Background(), dir, en, c.rng, o, r); err != nil {
		t.Fatal(err)
	}
	if got := e.Seq(0) - sent; got <= stallBurst {
		t.Fatalf("the engine published %d messages, want more than %d", got, stallBurst)
	}
	if !c.caughtUp(en) {
		t.Fatal("the stream did not recover after the stall")
	}
	after, _ := streamOf(dir, e.Name())
	if r.lossyStalls != 1 || after.Gaps <= before.Gaps || after.SnapshotsOK <= before.SnapshotsOK {
		t.Fatalf("no loss seen: lossy stalls %d, gaps %d -> %d, snapshots %d -> %d",
			r.lossyStalls, before.Gaps, after.Gaps, before.SnapshotsOK, after.SnapshotsOK)
	}
	// Delivered messages are what the stream applied, and fewer than
	// the engine sent: the rest were dropped by the engine's XPUB.
	if applied := after.BatchesApplied - before.BatchesApplied; applied >= stallBurst {
		t.Fatalf("%d of %d burst messages applied: nothing was dropped", applied, stallBurst)
	}
	if !c.exact(en) || r.failed() != 0 {
		t.Fatalf("not exact after recovery: %v", r.examples)
	}
}
