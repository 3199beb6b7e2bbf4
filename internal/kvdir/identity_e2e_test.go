package kvdir_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/config"
	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/etcdembed"
	"github.com/kvcar/kvcar/internal/instance"
	"github.com/kvcar/kvcar/internal/kvdir"
	"github.com/kvcar/kvcar/internal/lb"
)

// This file is an external test package so that it can route with lb,
// which imports kvdir, over a directory that real discovery fills from a
// real registry on an embedded etcd.

const identityBlock = 4

func identityLogger() *slog.Logger {
	level := slog.LevelError
	if os.Getenv("KVCAR_TEST_LOG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

func identityLimits() kvdir.Limits {
	return kvdir.Limits{MaxBlocksPerStream: 4096, MaxMessageBytes: 1 << 20, MaxBufferedBytes: 4 << 20, ReplayTimeout: 500 * time.Millisecond}
}

// waitMatches polls the directory until every DP rank of name is
// synchronised with at least want device hit tokens for tokens.
func waitMatches(t *testing.T, dir *kvdir.Directory, name string, ranks int, tokens []uint32, want int) []kvdir.Match {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	var got []kvdir.Match
	for time.Now().Before(deadline) {
		got = got[:0]
		for _, m := range dir.Query(tokens, nil) {
			if m.InstanceName == name && m.Synchronized && m.DeviceHitTokens >= want {
				got = append(got, m)
			}
		}
		if len(got) == ranks {
			return got
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s: %d of %d ranks synchronised with %d hit tokens; directory: %+v", name, len(got), ranks, want, dir.Query(tokens, nil))
	return nil
}

// Issue 10 item 12, R-DISC-5, R-CAR-7: an engine registered with
// neither incarnation_id nor register_ts_ms, found by discovery, gets
// its CAR hit benefit once its streams are synchronised; the same
// engine's streams listed statically get none, and neither does a
// registry identity that differs from the stream's.
func TestAnonymousDiscoveredInstanceGetsHits(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	etcd, err := etcdembed.Start(ctx, etcdembed.Options{Logger: identityLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	client, err := etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	reg, err := instance.New(instance.Options{Client: client, Logger: identityLogger()})
	if err != nil {
		t.Fatal(err)
	}
	dir, err := kvdir.New(identityLimits(), kvdir.Options{Logger: identityLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	disc := config.Discovery{Enabled: true, BlockSize: identityBlock, Topic: "xllm-kv", EventPortOffset: enginesim.DefaultEventPortOffset,
		ReplayPortOffset: enginesim.DefaultReplayPortOffset, RefreshInterval: 50 * time.Millisecond, HashSeed: 1024}
	done := make(chan struct{}, 2)
	go func() { reg.Run(ctx); done <- struct{}{} }()
	go func() { dir.RunDiscovery(ctx, reg, disc, 128); done <- struct{}{} }()
	defer func() { cancel(); <-done; <-done }()

	const dp = 2
	base, err := enginesim.FreeDiscoveryPort(dp, enginesim.DefaultEventPortOffset, enginesim.DefaultReplayPortOffset)
	if err != nil {
		t.Fatal(err)
	}
	e, err := enginesim.New(enginesim.Config{
		DPSize: dp, BlockSize: identityBlock, DeviceBlocks: 64, Topic: "xllm-kv",
		HTTPAddr:         fmt.Sprintf("127.0.0.1:%d", base),
		DiscoveryOffsets: enginesim.DefaultDiscoveryOffsets(),
		Etcd: &enginesim.EtcdConfig{Endpoints: etcd.Endpoints(), Type: enginesim.TypeDefault, LeaseTTL: time.Second,
			OmitIncarnation: true, ExtraMeta: map[string]any{"register_ts_ms": nil}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	name := e.Name()

	wctx, wcancel := context.WithTimeout(ctx, 15*time.Second)
	defer wcancel()
	if err := reg.WaitFor(wctx, func(s *instance.Snapshot) bool { _, ok := s.Lookup(name); return ok }); err != nil {
		t.Fatal(err)
	}
	if in, _ := reg.Lookup(name); in.Incarnation() != "" {
		t.Fatalf("the engine registered an identity %q; the test needs none", in.Incarnation())
	}
	// CAR routes only instances with a load report; the engine's own
	// heartbeats would need a master, so the report goes to the
	// registry's intake directly.
	if err := reg.Heartbeat(instance.Heartbeat{Name: name, Load: &instance.Load{WaitingRequests: 0, GPUCacheUsagePerc: 0.1}}); err != nil {
		t.Fatal(err)
	}
	if err := reg.WaitFor(wctx, func(s *instance.Snapshot) bool { in, _ := s.Lookup(name); return in.LoadUsable() }); err != nil {
		t.Fatal(err)
	}

	prompt := make([]uint32, 3*identityBlock+2)
	for i := range prompt {
		prompt[i] = uint32(1000 + i)
	}
	for r := range dp {
		if _, _, err := e.Prefill(r, prompt); err != nil {
			t.Fatal(err)
		}
	}
	ms := waitMatches(t, dir, name, dp, prompt, 3*identityBlock)
	for _, m := range ms {
		if m.Incarnation != "" || !m.Discovered {
			t.Fatalf("stream %s/dp%d: incarnation %q discovered %v, want a discovered stream without identity", m.InstanceName, m.DPRank, m.Incarnation, m.Discovered)
		}
	}

	car, err := lb.NewCAR(1, 0.5) // λ = 1: the decision is the cache term alone
	if err != nil {
		t.Fatal(err)
	}
	car.SetPrefixView(dir)
	want := float64(3*identityBlock) / float64(len(prompt))
	d, err := car.Route(lb.Request{TokenIDs: prompt}, reg.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	if d.Prefill != name || d.HitRatio != want {
		t.Errorf("discovered instance without identity: prefill %q hit %v, want %q with %v", d.Prefill, d.HitRatio, name, want)
	}

	// The registry naming an identity the stream was not subscribed for
	// (a new process registered before discovery caught up) refuses the
	// hits, whichever side has one.
	snap := reg.Snapshot()
	for _, id := range []struct {
		incarnation string
		registerTs  int64
	}{{"later", 0}, {"", 1700000000123}} {
		other := *snap
		other.Instances = append([]instance.Instance(nil), snap.Instances...)
		for i := range other.Instances {
			if other.Instances[i].Meta.Name == name {
				other.Instances[i].Meta.IncarnationID, other.Instances[i].Meta.RegisterTsMs = id.incarnation, id.registerTs
			}
		}
		d, err := car.Route(lb.Request{TokenIDs: prompt}, &other)
		if err != nil {
			t.Fatal(err)
		}
		if d.HitRatio != 0 {
			t.Errorf("registry identity %+v, stream without one: hit %v, want 0", id, d.HitRatio)
		}
	}

	// The same engine's streams listed statically: no tie to the
	// registry, no benefit (R-CAR-7).
	static, err := kvdir.New(identityLimits(), kvdir.Options{Logger: identityLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer static.Close()
	var specs []kvdir.StreamSpec
	for r := range dp {
		specs = append(specs, kvdir.StreamSpec{InstanceName: name, DPRank: r, Endpoint: e.EventEndpoint(r), ReplayEndpoint: e.ReplayEndpoint(r),
			Topic: "xllm-kv", BlockSize: identityBlock, HashSeed: 1024})
	}
	if err := static.SetStreams(specs); err != nil {
		t.Fatal(err)
	}
	waitMatches(t, static, name, dp, prompt, 3*identityBlock)
	car.SetPrefixView(static)
	d, err = car.Route(lb.Request{TokenIDs: prompt}, reg.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	if d.HitRatio != 0 {
		t.Errorf("static streams without identity: hit %v, want 0", d.HitRatio)
	}
}
