package kvdir

import (
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/config"
	"github.com/kvcar/kvcar/internal/instance"
)

func discoveryConfig() config.Discovery {
	return config.Discovery{Enabled: true, BlockSize: 128, Topic: "xllm-kv", EventPortOffset: 10000,
		ReplayPortOffset: 30000, RefreshInterval: 50 * time.Millisecond, HashSeed: 1024}
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

// TestPlanSelection covers R-DISC-3/4: DEFAULT, PREFILL and MIX acting as
// PREFILL are subscribed; DECODE, MIX acting as DECODE, other backends
// and SUSPECT instances are not; a lost lease within grace keeps its
// streams.
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
	specs, _ := Plan(snapOf(
		inst("10.0.0.1:8000", instance.Default, 1), inst("10.0.0.2:8000", instance.Prefill, 1),
		inst("10.0.0.3:8000", instance.Decode, 1), mixP, mixD, vllm, lost, suspect,
	), discoveryConfig(), 128)
	got := strings.Join(names(specs), " ")
	want := "10.0.0.1:8000/dp0 10.0.0.2:8000/dp0 10.0.0.4:8000/dp0 10.0.0.7:8000/dp0"
	if got != want {
		t.Fatalf("subscribed %s, want %s", got, want)
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
