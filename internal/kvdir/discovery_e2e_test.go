package kvdir

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvcar/kvcar/internal/config"
	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/etcdembed"
	"github.com/kvcar/kvcar/internal/instance"
)

// discoveryEnv is a real embedded etcd, the real instance registry over
// it, and a directory whose streams discovery derives from the registry.
type discoveryEnv struct {
	etcd   *etcdembed.Server
	client *clientv3.Client
	reg    *instance.Registry
	dir    *Directory
}

func newDiscoveryEnv(t *testing.T, maxStreams int) *discoveryEnv {
	t.Helper()
	return newDiscoveryEnvWith(t, maxStreams, discoveryConfig4())
}

func newDiscoveryEnvWith(t *testing.T, maxStreams int, disc config.Discovery) *discoveryEnv {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	etcd, err := etcdembed.Start(ctx, etcdembed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	client, err := etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	reg, err := instance.New(instance.Options{
		Client:         client,
		SelfAddr:       "127.0.0.1:1",
		Logger:         testLogger(),
		LeaseLostGrace: 400 * time.Millisecond,
		SuspectTimeout: time.Second,
		ProbeTimeout:   200 * time.Millisecond,
		ProbeAttempts:  2,
		MasterLeaseTTL: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	dir := newDirectory(t, testLimits())
	done := make(chan struct{}, 2)
	go func() { reg.Run(ctx); done <- struct{}{} }()
	go func() { dir.RunDiscovery(ctx, reg, disc, maxStreams); done <- struct{}{} }()
	t.Cleanup(func() {
		cancel()
		<-done
		<-done
		client.Close()
		etcd.Close()
	})
	return &discoveryEnv{etcd: etcd, client: client, reg: reg, dir: dir}
}

// discoveryConfig4 is the default discovery rule with this file's small
// blocks.
func discoveryConfig4() config.Discovery {
	d := discoveryConfig()
	d.BlockSize = testBlock
	return d
}

func (env *discoveryEnv) engine(t *testing.T, typ enginesim.InstanceType, dp int) *enginesim.Engine {
	t.Helper()
	// Ports for at least two ranks are checked free, so that a restart
	// into more ranks finds its ports.
	base, err := enginesim.FreeDiscoveryPort(max(dp, 2), enginesim.DefaultEventPortOffset, enginesim.DefaultReplayPortOffset)
	if err != nil {
		t.Fatal(err)
	}
	e, err := enginesim.New(enginesim.Config{
		DPSize: dp, BlockSize: testBlock, DeviceBlocks: 64, Topic: "xllm-kv",
		HTTPAddr:         fmt.Sprintf("127.0.0.1:%d", base),
		DiscoveryOffsets: enginesim.DefaultDiscoveryOffsets(),
		Etcd:             &enginesim.EtcdConfig{Endpoints: env.etcd.Endpoints(), Type: typ, LeaseTTL: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func (env *discoveryEnv) streamNames() []string { return names(env.dir.set.Load().specs()) }

func (set *streamSet) specs() []StreamSpec {
	out := make([]StreamSpec, len(set.streams))
	for i, s := range set.streams {
		out[i] = s.spec
	}
	return out
}

func hasStreams(env *discoveryEnv, n int) func() (bool, string) {
	return func() (bool, string) {
		got := env.streamNames()
		return len(got) == n, joinNames(got)
	}
}

func joinNames(n []string) string {
	if len(n) == 0 {
		return "no streams"
	}
	out := n[0]
	for _, s := range n[1:] {
		out += " " + s
	}
	return out
}

// TestDiscoveryJoinAndLeave covers R-DISC-1/2/4: a registered engine is
// subscribed at its derived ports and synchronised; when it goes away
// (key deleted, health probe fails) it turns SUSPECT and its stream and
// query entries are deleted. It reports the reaction time from
// registration to a synchronised stream.
func TestDiscoveryJoinAndLeave(t *testing.T) {
	env := newDiscoveryEnv(t, 128)
	start := time.Now()
	e := env.engine(t, enginesim.TypeDefault, 1)
	k := StreamKey{e.Name(), 0}
	eventually(t, "stream discovered", 10*time.Second, hasStreams(env, 1))
	waitSynced(t, env.dir, k, 0)
	t.Logf("registration to synchronised stream: %v", time.Since(start).Round(time.Millisecond))
	if s := env.dir.streamOf(k); s.spec.Incarnation != e.IncarnationID() {
		t.Fatalf("stream incarnation %q, engine %q", s.spec.Incarnation, e.IncarnationID())
	}
	prompt := seqTokens(1, 3*testBlock)
	if _, _, err := e.Prefill(0, prompt); err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, env.dir, e, 0)
	assertQueryMatchesOracle(t, env.dir, e, 0, prompt)

	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "stream removed after the engine left", 10*time.Second, hasStreams(env, 0))
	if got := env.dir.Query(prompt, nil); len(got) != 0 {
		t.Fatalf("query entries left: %+v", got)
	}
}

// TestDiscoveryLeaseLostGrace covers R-DISC-4: a lost lease with a healthy
// engine keeps the stream (LEASE_LOST) until the grace without heartbeat
// ends (SUSPECT), then the stream goes.
func TestDiscoveryLeaseLostGrace(t *testing.T) {
	env := newDiscoveryEnv(t, 128)
	e := env.engine(t, enginesim.TypeDefault, 1)
	eventually(t, "stream discovered", 10*time.Second, hasStreams(env, 1))
	if err := e.LoseLease(); err != nil {
		t.Fatal(err)
	}
	sawLeaseLost := false
	eventually(t, "LEASE_LOST then SUSPECT", 15*time.Second, func() (bool, string) {
		in, ok := env.reg.Lookup(e.Name())
		if ok && in.State == instance.LeaseLost {
			sawLeaseLost = true
			if n := len(env.streamNames()); n != 1 {
				t.Fatalf("stream dropped while LEASE_LOST within grace: %d streams", n)
			}
		}
		return sawLeaseLost && len(env.streamNames()) == 0, joinNames(env.streamNames())
	})
}

// TestDiscoveryProcessReplacement covers R-DISC-5 and R-CAR-7: a new
// process at the same address (new incarnation) retires the old stream;
// the new one serves no old hits and synchronises from its own snapshot.
func TestDiscoveryProcessReplacement(t *testing.T) {
	env := newDiscoveryEnv(t, 128)
	e := env.engine(t, enginesim.TypeDefault, 1)
	k := StreamKey{e.Name(), 0}
	eventually(t, "stream discovered", 10*time.Second, hasStreams(env, 1))
	old := seqTokens(1, 3*testBlock)
	if _, _, err := e.Prefill(0, old); err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, env.dir, e, 0)
	oldStream, oldInc := env.dir.streamOf(k), e.IncarnationID()
	if err := e.Restart(); err != nil {
		t.Fatal(err)
	}
	if e.IncarnationID() == oldInc {
		t.Fatal("restart kept the incarnation")
	}
	eventually(t, "stream replaced for the new incarnation", 10*time.Second, func() (bool, string) {
		s := env.dir.streamOf(k)
		return s != nil && s != oldStream && s.spec.Incarnation == e.IncarnationID(), joinNames(env.streamNames())
	})
	m := waitSynced(t, env.dir, k, 0)
	if m.Incarnation != e.IncarnationID() {
		t.Fatalf("match incarnation %q, want %q", m.Incarnation, e.IncarnationID())
	}
	if m := matchOf(t, env.dir, k, old); m.ReusablePrefixTokens != 0 {
		t.Fatalf("old process's blocks served after replacement: %s", describe(m))
	}
	select {
	case <-oldStream.done:
	default:
		t.Fatal("old stream goroutine still running")
	}
}

// TestDiscoveryDPSizeChange covers R-DISC-5: a change of DP topology
// updates the subscription to one stream per new rank.
func TestDiscoveryDPSizeChange(t *testing.T) {
	env := newDiscoveryEnv(t, 128)
	e := env.engine(t, enginesim.TypeDefault, 1)
	eventually(t, "one stream", 10*time.Second, hasStreams(env, 1))
	if err := e.RestartWithDPSize(2); err != nil {
		t.Fatal(err)
	}
	eventually(t, "two streams of the new process", 10*time.Second, func() (bool, string) {
		set := env.dir.set.Load()
		ok := len(set.streams) == 2
		for _, s := range set.streams {
			ok = ok && s.spec.Incarnation == e.IncarnationID()
		}
		return ok, joinNames(env.streamNames())
	})
	for dp := range 2 {
		if _, _, err := e.Prefill(dp, seqTokens(dp*100, 2*testBlock)); err != nil {
			t.Fatal(err)
		}
		waitCaughtUp(t, env.dir, e, dp)
		assertMatchesEngine(t, env.dir, e, dp)
	}
}

// TestDiscoveryRolesAndTypes covers R-DISC-3: DECODE instances are not
// subscribed; a MIX instance is subscribed while it plays PREFILL and
// dropped when it plays DECODE.
func TestDiscoveryRolesAndTypes(t *testing.T) {
	env := newDiscoveryEnv(t, 128)
	dec := env.engine(t, enginesim.TypeDecode, 1)
	eventually(t, "decode registered", 10*time.Second, func() (bool, string) {
		_, ok := env.reg.Lookup(dec.Name())
		return ok, "not yet"
	})
	mix := env.engine(t, enginesim.TypeMix, 1)
	eventually(t, "MIX as PREFILL subscribed, DECODE not", 10*time.Second, func() (bool, string) {
		got := env.streamNames()
		return len(got) == 1 && got[0] == mix.Name()+"/dp0", joinNames(got)
	})
	if err := env.reg.SetRole(mix.Name(), instance.Decode); err != nil {
		t.Fatal(err)
	}
	eventually(t, "MIX as DECODE dropped", 10*time.Second, hasStreams(env, 0))
}

// TestDiscoveryMaxStreamsWholeInstances covers R-DISC-7 end to end.
func TestDiscoveryMaxStreamsWholeInstances(t *testing.T) {
	env := newDiscoveryEnv(t, 2)
	var engines []*enginesim.Engine
	for _, dp := range []int{1, 2, 1} {
		engines = append(engines, env.engine(t, enginesim.TypeDefault, dp))
	}
	eventually(t, "registered", 10*time.Second, func() (bool, string) {
		return len(env.reg.Snapshot().Instances) == 3, "waiting"
	})
	// 1+2+1 DP streams never fit in 2: whichever instances come first in
	// name order fill the budget exactly.
	eventually(t, "budget filled", 10*time.Second, hasStreams(env, 2))
	perInstance := map[string]int{}
	for _, s := range env.dir.set.Load().streams {
		perInstance[s.spec.InstanceName]++
	}
	for _, e := range engines {
		if n := perInstance[e.Name()]; n != 0 && n != e.DPSize() {
			t.Fatalf("instance %s has %d of its %d DP streams", e.Name(), n, e.DPSize())
		}
	}
}
