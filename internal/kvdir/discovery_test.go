package kvdir

import (
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/config"
	"github.com/kvcar/kvcar/internal/instance"
)

// discoveryConfig is the configuration's discovery defaults, refreshed
// every 50 ms.
func discoveryConfig() config.Discovery {
	d := config.Default().Discovery
	d.Enabled, d.RefreshInterval = true, 50*time.Millisecond
	return d
}

func inst(name string, typ instance.Type, dp int) instance.Instance {
	return instance.Instance{
		Meta:  instance.Meta{Name: name, Type: typ, DPSize: dp, BackendType: "xllm", IncarnationID: "inc-" + name},
		Type:  typ,
		Role:  typ,
		State: instance.Active,
	}
}

func snapOf(insts ...instance.Instance) *instance.Snapshot {
	return &instance.Snapshot{Instances: insts, Version: 1, Synced: true}
}

func names(specs []StreamSpec) []string {
	var out []string
	for _, s := range specs {
		out = append(out, s.String())
	}
	return out
}

func reasonOf(excl []Exclusion, name string) string {
	for _, e := range excl {
		if e.Instance == name {
			return e.Reason
		}
	}
	return ""
}

// TestPlanAddresses covers R-DISC-2: endpoints derive from the business
// port plus the offsets plus the DP rank.
func TestPlanAddresses(t *testing.T) {
	specs, excl := Plan(snapOf(inst("127.0.0.1:8000", instance.Default, 2)), discoveryConfig(), 128)
	if len(excl) != 0 || len(specs) != 2 {
		t.Fatalf("specs %v, excluded %v", names(specs), excl)
	}
	want := [][2]string{{"tcp://127.0.0.1:18000", "tcp://127.0.0.1:38000"}, {"tcp://127.0.0.1:18001", "tcp://127.0.0.1:38001"}}
	for i, s := range specs {
		if s.DPRank != i || s.Endpoint != want[i][0] || s.ReplayEndpoint != want[i][1] ||
			s.Topic != "xllm-kv" || s.BlockSize != 128 || s.HashSeed != 1024 || s.Incarnation != "inc-127.0.0.1:8000" {
			t.Errorf("spec %d = %+v", i, s)
		}
	}
	v6, _ := Plan(snapOf(inst("[::1]:8000", instance.Prefill, 1)), discoveryConfig(), 128)
	if len(v6) != 1 || v6[0].Endpoint != "tcp://[::1]:18000" {
		t.Fatalf("IPv6: %+v", v6)
	}
}

// TestPlanSelection covers R-DISC-3/4 and item 1: DEFAULT, PREFILL and
// MIX acting as PREFILL are subscribed whatever their backend_type;
// DECODE, MIX acting as DECODE and SUSPECT instances are not, and each
// one left out comes back with its reason; a lost lease within grace
// keeps its streams.
func TestPlanSelection(t *testing.T) {
	mixP := inst("10.0.0.4:8000", instance.Mix, 1)
	mixP.Role = instance.Prefill
	mixD := inst("10.0.0.5:8000", instance.Mix, 1)
	mixD.Role = instance.Decode
	vllm := inst("10.0.0.6:8000", instance.Default, 1)
	vllm.Meta.BackendType = "vllm"
	lost := inst("10.0.0.7:8000", instance.Default, 1)
	lost.State = instance.LeaseLost
	suspect := inst("10.0.0.8:8000", instance.Default, 1)
	suspect.State = instance.Suspect
	specs, excl := Plan(snapOf(
		inst("10.0.0.1:8000", instance.Default, 1), inst("10.0.0.2:8000", instance.Prefill, 1),
		inst("10.0.0.3:8000", instance.Decode, 1), mixP, mixD, vllm, lost, suspect,
	), discoveryConfig(), 128)
	got := strings.Join(names(specs), " ")
	want := "10.0.0.1:8000/dp0 10.0.0.2:8000/dp0 10.0.0.4:8000/dp0 10.0.0.6:8000/dp0 10.0.0.7:8000/dp0"
	if got != want {
		t.Fatalf("subscribed %s, want %s", got, want)
	}
	for name, want := range map[string]string{
		"10.0.0.3:8000": "DECODE instance", "10.0.0.5:8000": "MIX instance acting as DECODE", "10.0.0.8:8000": "SUSPECT",
	} {
		if r := reasonOf(excl, name); !strings.Contains(r, want) {
			t.Errorf("%s left out with reason %q, want %q", name, r, want)
		}
	}
	if len(excl) != 3 {
		t.Errorf("exclusions %v", excl)
	}
	for _, e := range excl {
		if e.Fault() {
			t.Errorf("%v is the rule, not a fault", e)
		}
	}
}

// Item 1, 2, 4 and 7 in the plan: a vLLM instance registered by
// xllm-service's vllm_sidecar gets its backend's sync mode (live by
// default: no replay endpoint derived) and topic template; an instance
// with one rank accepts batches of any rank (vLLM's per-rank servers);
// templates expand per stream.
func TestPlanBackendModesAndTopics(t *testing.T) {
	vllm := inst("10.0.0.6:8000", instance.Default, 1)
	vllm.Meta.BackendType = "vllm"
	sgl := inst("10.0.0.9:8100", instance.Prefill, 2)
	sgl.Meta.BackendType = "sglang"
	d := discoveryConfig()
	d.SyncMode, d.VLLMSyncMode, d.SGLangSyncMode = config.SyncSnapshot, config.SyncLive, config.SyncHistory
	d.Topic, d.VLLMTopic, d.SGLangTopic = "xllm-kv", "", "kv@{host}:{port}@{dp_rank}"
	specs, excl := Plan(snapOf(inst("10.0.0.1:8000", instance.Default, 1), vllm, sgl), d, 128)
	if len(excl) != 0 || len(specs) != 4 {
		t.Fatalf("specs %v excluded %v", names(specs), excl)
	}
	by := map[string]StreamSpec{}
	for _, s := range specs {
		by[s.String()] = s
	}
	x, v, s0, s1 := by["10.0.0.1:8000/dp0"], by["10.0.0.6:8000/dp0"], by["10.0.0.9:8100/dp0"], by["10.0.0.9:8100/dp1"]
	if x.SyncMode() != config.SyncSnapshot || x.ReplayEndpoint != "tcp://10.0.0.1:38000" || x.Topic != "xllm-kv" || !x.AnyRank {
		t.Errorf("xllm spec %+v", x)
	}
	if v.SyncMode() != config.SyncLive || v.ReplayEndpoint != "" || v.Endpoint != "tcp://10.0.0.6:18000" || v.Topic != "" || !v.AnyRank {
		t.Errorf("vllm spec %+v", v)
	}
	if s0.SyncMode() != config.SyncHistory || s0.ReplayEndpoint != "tcp://10.0.0.9:38100" || s0.Topic != "kv@10.0.0.9:8100@0" || s0.AnyRank {
		t.Errorf("sglang dp0 spec %+v", s0)
	}
	if s1.ReplayEndpoint != "tcp://10.0.0.9:38101" || s1.Topic != "kv@10.0.0.9:8100@1" || s1.AnyRank {
		t.Errorf("sglang dp1 spec %+v", s1)
	}
	// A live instance claims no replay port: another instance's event
	// port 10 apart does not collide with it.
	d.ReplayPortOffset = 10010
	vllm2 := inst("10.0.0.6:8010", instance.Default, 1)
	vllm2.Meta.BackendType = "vllm"
	if specs, excl := Plan(snapOf(vllm, vllm2), d, 128); len(specs) != 2 || len(excl) != 0 {
		t.Fatalf("live instances: specs %v excluded %v", names(specs), excl)
	}
}

// TestPlanPortOverflowAndConflicts covers R-DISC-6: an instance whose
// ports overflow is excluded, and every instance sharing a port with
// another on the same host is excluded, never mixed.
func TestPlanPortOverflowAndConflicts(t *testing.T) {
	specs, excl := Plan(snapOf(
		inst("127.0.0.1:60000", instance.Default, 1), // 60000+10000 > 65535
		inst("127.0.0.1:8000", instance.Default, 2),  // events 18000, 18001
		inst("127.0.0.1:8001", instance.Default, 1),  // events 18001: conflict
		inst("127.0.0.2:8001", instance.Default, 1),  // other host: fine
		inst("127.0.0.1:18005", instance.Default, 1), // HTTP port of it ...
		inst("127.0.0.1:8005", instance.Default, 1),  // ... is this one's event port
	), discoveryConfig(), 128)
	if got := strings.Join(names(specs), " "); got != "127.0.0.2:8001/dp0" {
		t.Fatalf("subscribed %s", got)
	}
	if r := reasonOf(excl, "127.0.0.1:60000"); !strings.Contains(r, "port overflow") {
		t.Errorf("overflow reason %q", r)
	}
	kinds := map[string]int{}
	for _, e := range excl {
		kinds[e.Kind]++
	}
	if kinds[ExcludePortOverflow] != 1 || kinds[ExcludePortConflict] != 4 {
		t.Errorf("exclusion kinds %v", kinds)
	}
	for _, n := range []string{"127.0.0.1:8000", "127.0.0.1:8001"} {
		if r := reasonOf(excl, n); !strings.Contains(r, "port conflict on 127.0.0.1:18001") {
			t.Errorf("%s: reason %q", n, r)
		}
	}
	for _, n := range []string{"127.0.0.1:18005", "127.0.0.1:8005"} {
		if r := reasonOf(excl, n); !strings.Contains(r, "127.0.0.1:18005") {
			t.Errorf("%s: reason %q", n, r)
		}
	}
	// Offsets that make one instance's event and replay ranges overlap.
	d := discoveryConfig()
	d.ReplayPortOffset = 10001
	if specs, excl := Plan(snapOf(inst("127.0.0.1:8000", instance.Default, 2)), d, 128); len(specs) != 0 || len(excl) != 1 {
		t.Fatalf("overlapping ranges: specs %v excluded %v", names(specs), excl)
	}
}

// TestPlanMaxStreams covers R-DISC-7: instances that do not fit are
// skipped whole, in name order, never a partial set of their DP ranks.
func TestPlanMaxStreams(t *testing.T) {
	specs, excl := Plan(snapOf(
		inst("10.0.0.3:8000", instance.Default, 1),
		inst("10.0.0.1:8000", instance.Default, 2),
		inst("10.0.0.2:8000", instance.Default, 2),
	), discoveryConfig(), 3)
	if got := strings.Join(names(specs), " "); got != "10.0.0.1:8000/dp0 10.0.0.1:8000/dp1 10.0.0.3:8000/dp0" {
		t.Fatalf("subscribed %s", got)
	}
	if r := reasonOf(excl, "10.0.0.2:8000"); !strings.Contains(r, "max_streams (3)") {
		t.Fatalf("reason %q", r)
	}
}
