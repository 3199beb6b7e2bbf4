package kvdir

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/config"
	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/freeport"
	"github.com/kvcar/kvcar/internal/instance"
)

// freePorts returns a port p such that p .. p+n-1 are free on loopback
// right now, outside the kernel's ephemeral range (freeport.Run).
func freePorts(t *testing.T, n int) int {
	t.Helper()
	p, err := freeport.Run(n)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// waitRelayed waits until the hub of bind relays to n stream connections.
func waitRelayed(t *testing.T, d *Directory, bind string, n uint64) {
	t.Helper()
	eventually(t, "streams subscribed to the bound subscriber's relay", 10*time.Second, func() (bool, string) {
		d.mu.Lock()
		defer d.mu.Unlock()
		for k, h := range d.hubs {
			if k.bind == bind {
				got := h.subscriptions.Load()
				return got >= n, fmt.Sprintf("%d subscriptions", got)
			}
		}
		return false, "no hub"
	})
}

// Item 5: kvcar binds one subscriber and the engines dial it (vLLM with a
// non-wildcard endpoint, llm-d's convention). Streams are told apart by
// topic, and the DP ranks of one engine, which share a topic and dial
// port+rank, by the rank their batches carry. Nothing crosses over.
func TestBoundSubscriber(t *testing.T) {
	port := freePorts(t, 2)
	bind := fmt.Sprintf("tcp://127.0.0.1:%d", port)
	mk := func(name, topic string, dp int) *enginesim.Engine {
		return startEngine(t, enginesim.Config{Name: name, DPSize: dp, DeviceBlocks: 64, Topic: topic,
			Replay: enginesim.ReplayNone, Shape: vllmShape, DialEvents: bind})
	}
	a, b, c := mk("10.0.0.1:8000", "kv@a", 1), mk("10.0.0.2:8000", "kv@b", 1), mk("10.0.0.3:8000", "kv@c", 2)
	spec := func(e *enginesim.Engine, dp int, topic string, anyRank bool) StreamSpec {
		return StreamSpec{InstanceName: e.Name(), DPRank: dp, Endpoint: bind, Topic: topic, Mode: config.SyncLive,
			AnyRank: anyRank, Bind: bind, BindPorts: 2, BlockSize: testBlock, HashSeed: 1024}
	}
	d := newDirectory(t, testLimits(), spec(a, 0, "kv@a", true), spec(b, 0, "kv@b", true), spec(c, 0, "kv@c", false), spec(c, 1, "kv@c", false))
	waitRelayed(t, d, bind, 4)
	for _, e := range []*enginesim.Engine{a, b, c} {
		for dp := range e.DPSize() {
			if err := e.WaitSubscribed(t.Context(), dp, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got, want := c.EventEndpoint(1), fmt.Sprintf("tcp://127.0.0.1:%d", port+1); got != want {
		t.Fatalf("rank 1 dials %s, want %s", got, want)
	}
	prompts := map[string][]uint32{}
	for i, e := range []*enginesim.Engine{a, b, c} {
		for dp := range e.DPSize() {
			p := seqTokens(1000*i+100*dp, 2*testBlock)
			prompts[fmt.Sprintf("%s/%d", e.Name(), dp)] = p
			if _, _, err := e.Prefill(dp, p); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, e := range []*enginesim.Engine{a, b, c} {
		for dp := range e.DPSize() {
			m := waitCaughtUp(t, d, e, dp)
			if !m.Complete {
				t.Errorf("%s/%d: %s not complete", e.Name(), dp, describe(m))
			}
			for key, p := range prompts {
				want := 0
				if key == fmt.Sprintf("%s/%d", e.Name(), dp) {
					want = len(p)
				}
				if got := matchOf(t, d, StreamKey{e.Name(), dp}, p).ReusablePrefixTokens; got != want {
					t.Errorf("stream %s/%d, prompt of %s: hit %d, want %d", e.Name(), dp, key, got, want)
				}
			}
		}
	}
	if n := d.streamOf(StreamKey{c.Name(), 0}).counters.otherRank.Load(); n == 0 {
		t.Errorf("rank 0 of the shared topic never saw rank 1's batch")
	}
}

// Bound-subscriber discovery: streams get the bind address and the port
// their rank dials; instances whose topics coincide, or whose ranks
// exceed the bound ports, are left out with the reason.
func TestPlanSubscribeBind(t *testing.T) {
	d := discoveryConfig()
	d.SubscribeBind, d.SubscribeBindPorts = "tcp://*:5557", 2
	d.Topic, d.VLLMTopic = "kv@{name}", "kv@{host}"
	v1 := inst("10.0.0.6:8000", instance.Default, 1)
	v1.Meta.BackendType = "vllm"
	v2 := inst("10.0.0.6:8001", instance.Default, 1) // same host: same topic
	v2.Meta.BackendType = "vllm"
	specs, excl := Plan(snapOf(inst("10.0.0.1:8000", instance.Default, 2), inst("10.0.0.2:8000", instance.Default, 3), v1, v2), d, 128)
	if got := strings.Join(names(specs), " "); got != "10.0.0.1:8000/dp0 10.0.0.1:8000/dp1" {
		t.Fatalf("subscribed %s (excluded %v)", got, excl)
	}
	if specs[1].Bind != "tcp://*:5557" || specs[1].Endpoint != "tcp://*:5558" || specs[1].Topic != "kv@10.0.0.1:8000" {
		t.Fatalf("spec %+v", specs[1])
	}
	kinds := map[string]string{}
	for _, e := range excl {
		kinds[e.Instance] = e.Kind
	}
	if kinds["10.0.0.2:8000"] != ExcludeBindPorts || kinds["10.0.0.6:8000"] != ExcludeTopicConflict || kinds["10.0.0.6:8001"] != ExcludeTopicConflict {
		t.Fatalf("exclusions %v", excl)
	}
}
