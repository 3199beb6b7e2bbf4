package instance

import (
	"errors"
	"log/slog"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/testlog"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// R-DISC-1: an engine's PUT registers it ACTIVE with its meta, visible
// in the lock-free snapshot.
func TestJoinIsActive(t *testing.T) {
	srv := startEtcd(t)
	cli := newClient(t, srv.Endpoint())
	reg := startRegistry(t, cli, fastOptions())

	v0 := reg.Snapshot().Version
	changed := reg.Changes()
	m := engineMeta("127.0.0.1:8000", Prefill, "inc-1").
		with("dp_size", 2).
		with("register_ts_ms", 1700000000000).
		with("kv_split_size", 4).
		with("ttft_profiling_data", []any{[]any{128, 10.5}, []any{"bad"}, []any{256, 20}}).
		with("tpot_profiling_data", []any{[]any{100, 8, 30.25}}).
		with("some_future_field", true)
	put(t, cli, engineKey("", Prefill, "127.0.0.1:8000"), m.json(t))

	select {
	case <-changed:
	case <-time.After(waitLimit):
		t.Fatal("Changes did not fire for a registration")
	}
	in := waitInst(t, reg.Registry, "127.0.0.1:8000", "active", inState(Active))
	if in.Type != Prefill || in.Role != Prefill {
		t.Errorf("type/role = %v/%v, want PREFILL/PREFILL", in.Type, in.Role)
	}
	if in.Incarnation() != "inc-1" {
		t.Errorf("Incarnation() = %q, want inc-1", in.Incarnation())
	}
	if !in.Schedulable() || in.HasLoad || in.LoadUsable() {
		t.Errorf("schedulable=%v has_load=%v usable=%v, want true/false/false", in.Schedulable(), in.HasLoad, in.LoadUsable())
	}
	got := in.Meta
	if got.RPCAddress != "127.0.0.1:19999" || got.DPSize != 2 || got.KVSplitSize != 4 || got.BackendType != "xllm" ||
		got.RegisterTsMs != 1700000000000 || len(got.ClusterIDs) != 1 || got.Ports[0] != 9000 {
		t.Errorf("meta = %+v", got)
	}
	if len(got.TTFTProfile) != 2 || got.TTFTProfile[1] != (TTFTPoint{InputLen: 256, TTFTMs: 20}) {
		t.Errorf("ttft profile = %+v, want the two well-formed points", got.TTFTProfile)
	}
	if len(got.TPOTProfile) != 1 || got.TPOTProfile[0] != (TPOTPoint{AvgLen: 100, BatchSize: 8, TPOTMs: 30.25}) {
		t.Errorf("tpot profile = %+v", got.TPOTProfile)
	}
	if s := reg.Snapshot(); s.Version <= v0 || !s.Synced {
		t.Errorf("snapshot version %d (was %d) synced %v", s.Version, v0, s.Synced)
	}
	// The registry's snapshots come with their briefs.
	if s := reg.Snapshot(); !slices.Equal(s.Briefs(), AppendBriefs(nil, s.Instances)) || len(s.Briefs()) != len(s.Instances) {
		t.Errorf("snapshot briefs %+v, want those of %d instances", s.Briefs(), len(s.Instances))
	}
	if _, ok := reg.Lookup("127.0.0.1:8001"); ok {
		t.Error("Lookup found an instance that never registered")
	}
}

// R-DISC-1: instances registered before the service starts are all in
// its first synced snapshot, never a partial view.
func TestInitialListingIsComplete(t *testing.T) {
	srv := startEtcd(t)
	cli := newClient(t, srv.Endpoint())
	names := []string{"127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"}
	for i, n := range names {
		put(t, cli, engineKey("", Type(i), n), engineMeta(n, Type(i), "x").json(t))
	}
	reg, err := New(Options{Client: cli, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if s := reg.Snapshot(); s.Synced || len(s.Instances) != 0 {
		t.Fatalf("snapshot before Run: %s", dump(s))
	}
	r := startRegistry(t, cli, Options{})
	s := r.Snapshot()
	if len(s.Instances) != len(names) {
		t.Fatalf("first synced snapshot has %d instances, want %d:\n%s", len(s.Instances), len(names), dump(s))
	}
	for i, in := range s.Instances {
		if in.Meta.Name != names[i] {
			t.Errorf("instance %d is %s, want %s (sorted by name)", i, in.Meta.Name, names[i])
		}
	}
}

// WIRE.md state machine, R-DISC-4: DELETE with a healthy engine gives
// LEASE_LOST (still schedulable); without heartbeats it turns SUSPECT
// after the grace, then is removed after the suspect timeout.
func TestLeaveWithHealthyProbe(t *testing.T) {
	srv := startEtcd(t)
	cli := newClient(t, srv.Endpoint())
	opts := fastOptions()
	reg := startRegistry(t, cli, opts)
	h := newHealthServer(t)
	key := engineKey("", Default, h.name())
	put(t, cli, key, engineMeta(h.name(), Default, "a").json(t))
	waitInst(t, reg.Registry, h.name(), "active", inState(Active))

	deleted := time.Now()
	del(t, cli, key)
	in := waitInst(t, reg.Registry, h.name(), "lease lost", inState(LeaseLost))
	if !in.Schedulable() {
		t.Error("LEASE_LOST instance is not schedulable")
	}
	if h.probes.Load() != 1 {
		t.Errorf("%d health probes, want 1 (the first succeeded)", h.probes.Load())
	}
	in = waitInst(t, reg.Registry, h.name(), "suspect", inState(Suspect))
	if in.Schedulable() {
		t.Error("SUSPECT instance is schedulable")
	}
	if d := in.StateSince.Sub(deleted); d < opts.LeaseLostGrace {
		t.Errorf("SUSPECT %v after the delete, before the %v grace", d, opts.LeaseLostGrace)
	}
	suspect := in.StateSince
	waitGone(t, reg.Registry, h.name())
	if d := time.Since(suspect); d < opts.SuspectTimeout {
		t.Errorf("removed %v after SUSPECT, before the %v timeout", d, opts.SuspectTimeout)
	}
}

// WIRE.md: a failing probe (every attempt) makes the instance SUSPECT at
// once.
func TestLeaveWithFailingProbe(t *testing.T) {
	srv := startEtcd(t)
	cli := newClient(t, srv.Endpoint())
	reg := startRegistry(t, cli, fastOptions())
	h := newHealthServer(t)
	h.healthy.Store(false)
	key := engineKey("", Prefill, h.name())
	put(t, cli, key, engineMeta(h.name(), Prefill, "a").json(t))
	waitInst(t, reg.Registry, h.name(), "active", inState(Active))

	del(t, cli, key)
	waitInst(t, reg.Registry, h.name(), "suspect", inState(Suspect))
	if n := h.probes.Load(); n != 2 {
		t.Errorf("%d probe attempts, want ProbeAttempts = 2", n)
	}

	// Nothing listening at all fails the same way.
	dead := deadAddr(t)
	put(t, cli, engineKey("", Prefill, dead), engineMeta(dead, Prefill, "b").json(t))
	waitInst(t, reg.Registry, dead, "active", inState(Active))
	del(t, cli, engineKey("", Prefill, dead))
	waitInst(t, reg.Registry, dead, "suspect", inState(Suspect))
}

// WIRE.md: a heartbeat while SUSPECT gives LEASE_LOST; heartbeats keep
// it there past the grace; when they stop it is SUSPECT again; a PUT
// makes it ACTIVE.
func TestHeartbeatRescuesSuspect(t *testing.T) {
	srv := startEtcd(t)
	cli := newClient(t, srv.Endpoint())
	opts := fastOptions()
	opts.SuspectTimeout = 5 * time.Second // room for the heartbeats below
	reg := startRegistry(t, cli, opts)
	name := deadAddr(t)
	key := engineKey("", Decode, name)
	put(t, cli, key, engineMeta(name, Decode, "a").json(t))
	waitInst(t, reg.Registry, name, "active", inState(Active))
	del(t, cli, key)
	waitInst(t, reg.Registry, name, "suspect", inState(Suspect))

	hb := Heartbeat{Name: name, IncarnationID: "a"}
	if err := reg.Heartbeat(hb); err != nil {
		t.Fatal(err)
	}
	in, _ := reg.Lookup(name)
	if in.State != LeaseLost || !in.Schedulable() {
		t.Fatalf("after a heartbeat: %v, want LEASE_LOST", in.State)
	}
	// Heartbeats every quarter grace for two graces keep it LEASE_LOST.
	until := time.Now().Add(2 * opts.LeaseLostGrace)
	tick := time.NewTicker(opts.LeaseLostGrace / 4)
	for time.Now().Before(until) {
		<-tick.C
		if err := reg.Heartbeat(hb); err != nil {
			t.Fatal(err)
		}
		if in, _ := reg.Lookup(name); in.State != LeaseLost {
			t.Fatalf("heartbeating instance went %v", in.State)
		}
	}
	tick.Stop()
	waitInst(t, reg.Registry, name, "suspect once heartbeats stop", inState(Suspect))

	put(t, cli, key, engineMeta(name, Decode, "a").json(t))
	waitInst(t, reg.Registry, name, "active after a new PUT", inState(Active))
}

// R-DISC-4: an engine that dies without deleting its key loses it when
// its lease lapses; the probe fails and it becomes SUSPECT.
func TestEngineLeaseExpiry(t *testing.T) {
	srv := startEtcd(t)
	cli := newClient(t, srv.Endpoint())
	reg := startRegistry(t, cli, fastOptions())
	name := deadAddr(t)
	putLeased(t, cli, engineKey("", Default, name), engineMeta(name, Default, "a").json(t), 1)
	waitInst(t, reg.Registry, name, "active", inState(Active))
	waitInst(t, reg.Registry, name, "suspect after the lease lapsed", inState(Suspect))
	waitGone(t, reg.Registry, name)
}

// R-DISC-5: a PUT with a new incarnation replaces the instance (no load
// report yet, new identity); the same incarnation keeps load and role,
// and the same value again changes nothing.
func TestReplacementAndRefresh(t *testing.T) {
	srv := startEtcd(t)
	cli := newClient(t, srv.Endpoint())
	reg := startRegistry(t, cli, fastOptions())
	name := "127.0.0.1:8100"
	key := engineKey("", Prefill, name)
	put(t, cli, key, engineMeta(name, Prefill, "p1").json(t))
	first := waitInst(t, reg.Registry, name, "active", inState(Active))
	if err := reg.Heartbeat(Heartbeat{Name: name, IncarnationID: "p1", Load: &Load{WaitingRequests: 3, GPUCacheUsagePerc: 0.25}}); err != nil {
		t.Fatal(err)
	}

	// The same value again (an engine re-registering): nothing changes.
	v := reg.Snapshot().Version
	put(t, cli, key, engineMeta(name, Prefill, "p1").json(t))
	put(t, cli, engineKey("", Default, "127.0.0.1:8199"), engineMeta("127.0.0.1:8199", Default, "z").json(t))
	waitInst(t, reg.Registry, "127.0.0.1:8199", "marker", inState(Active))
	if got := reg.Snapshot().Version; got != v+1 {
		t.Errorf("version went from %d to %d; the repeated PUT must not publish", v, got)
	}
	// A Meta keeps its MetaGen through heartbeats and repeated PUTs; each
	// registration has its own, in the briefs too.
	snap := reg.Snapshot()
	again, _ := snap.Lookup(name)
	marker, _ := snap.Lookup("127.0.0.1:8199")
	if first.MetaGen == 0 || again.MetaGen != first.MetaGen || marker.MetaGen == first.MetaGen || marker.MetaGen == 0 {
		t.Errorf("MetaGens: first %d, after a heartbeat and the same PUT %d, another instance %d", first.MetaGen, again.MetaGen, marker.MetaGen)
	}
	for i, b := range snap.Briefs() {
		if b.MetaGen != snap.Instances[i].MetaGen {
			t.Errorf("brief %d has MetaGen %d, its instance %d", i, b.MetaGen, snap.Instances[i].MetaGen)
		}
	}

	// Same incarnation, new DP size: refreshed, load kept.
	put(t, cli, key, engineMeta(name, Prefill, "p1").with("dp_size", 4).json(t))
	in := waitInst(t, reg.Registry, name, "dp size 4", func(i Instance) bool { return i.Meta.DPSize == 4 })
	if !in.HasLoad || in.Load.WaitingRequests != 3 || !in.Registered.Equal(first.Registered) {
		t.Errorf("refresh reset the instance: %+v", in)
	}
	if in.MetaGen == first.MetaGen || in.MetaGen == marker.MetaGen {
		t.Errorf("a changed Meta kept MetaGen %d", in.MetaGen)
	}
	refreshed := in.MetaGen

	// New incarnation: a fresh instance.
	put(t, cli, key, engineMeta(name, Prefill, "p2").json(t))
	in = waitInst(t, reg.Registry, name, "new incarnation", func(i Instance) bool { return i.Incarnation() == "p2" })
	if in.HasLoad || in.LoadSource != LoadNone || in.Meta.DPSize != 1 || !in.Registered.After(first.Registered) {
		t.Errorf("replacement kept state of the old process: %+v", in)
	}
	if in.MetaGen == refreshed || in.MetaGen == first.MetaGen {
		t.Errorf("a new incarnation kept MetaGen %d", in.MetaGen)
	}
	if err := reg.Heartbeat(Heartbeat{Name: name, IncarnationID: "p1"}); !errors.Is(err, ErrStaleIncarnation) {
		t.Errorf("heartbeat of the replaced process: %v, want ErrStaleIncarnation", err)
	}

	// Without incarnation_id, register_ts_ms is the identity.
	ts := engineMeta(name, Prefill, "").with("register_ts_ms", 111)
	put(t, cli, key, ts.json(t))
	in = waitInst(t, reg.Registry, name, "identity from register_ts_ms", func(i Instance) bool { return i.Incarnation() == "111" })
	if err := reg.Heartbeat(Heartbeat{Name: name, Load: &Load{WaitingRequests: 1}}); err != nil {
		t.Fatal(err)
	}
	put(t, cli, key, ts.with("dp_size", 2).json(t))
	in = waitInst(t, reg.Registry, name, "dp 2", func(i Instance) bool { return i.Meta.DPSize == 2 })
	if !in.HasLoad {
		t.Error("same register_ts_ms treated as a new process")
	}
	put(t, cli, key, ts.with("register_ts_ms", 222).json(t))
	in = waitInst(t, reg.Registry, name, "new register_ts_ms", func(i Instance) bool { return i.Incarnation() == "222" })
	if in.HasLoad {
		t.Error("new register_ts_ms kept the old load")
	}
}

// A DELETE of a key the instance no longer uses (it re-registered under
// another type) is stale and must not start the leave path.
func TestStaleDeleteOfOldKeyIgnored(t *testing.T) {
	srv := startEtcd(t)
	cli := newClient(t, srv.Endpoint())
	reg := startRegistry(t, cli, fastOptions())
	name := deadAddr(t)
	put(t, cli, engineKey("", Prefill, name), engineMeta(name, Prefill, "a").json(t))
	waitInst(t, reg.Registry, name, "prefill", inState(Active))
	put(t, cli, engineKey("", Decode, name), engineMeta(name, Decode, "a").json(t))
	waitInst(t, reg.Registry, name, "moved to decode", func(i Instance) bool { return i.Type == Decode && i.Role == Decode })
	del(t, cli, engineKey("", Prefill, name))
	// Events arrive in revision order: once the marker is in, the delete
	// has been handled, and a handled delete would have started a probe.
	put(t, cli, engineKey("", Default, "127.0.0.1:8199"), engineMeta("127.0.0.1:8199", Default, "z").json(t))
	waitInst(t, reg.Registry, "127.0.0.1:8199", "marker", inState(Active))
	reg.mu.Lock()
	gone := reg.entries[name].keyGone
	reg.mu.Unlock()
	if in, _ := reg.Lookup(name); gone || in.State != Active {
		t.Fatalf("stale delete handled: key gone %v, state %v", gone, in.State)
	}
}

// R-DISC-3 is the directory's filter: the registry reports DECODE (and
// every backend) with its type so that the directory can skip it.
func TestDecodeAndBackendsReported(t *testing.T) {
	srv := startEtcd(t)
	cli := newClient(t, srv.Endpoint())
	reg := startRegistry(t, cli, fastOptions())
	put(t, cli, engineKey("", Decode, "127.0.0.1:8200"), engineMeta("127.0.0.1:8200", Decode, "d").json(t))
	put(t, cli, engineKey("", Default, "127.0.0.1:8201"),
		engineMeta("127.0.0.1:8201", Default, "v").with("backend_type", "vllm").json(t))
	d := waitInst(t, reg.Registry, "127.0.0.1:8200", "decode", inState(Active))
	if d.Type != Decode || d.Role != Decode {
		t.Errorf("decode instance type/role %v/%v", d.Type, d.Role)
	}
	v := waitInst(t, reg.Registry, "127.0.0.1:8201", "vllm", inState(Active))
	if v.Meta.BackendType != "vllm" {
		t.Errorf("backend_type %q, want vllm", v.Meta.BackendType)
	}
}

// R-CAR-2: a MIX instance joins P or D by its current role, decided as
// xllm-service decides it: DECODE when nobody plays DECODE yet, else
// PREFILL; refreshes keep it; SetRole flips it.
func TestMixRole(t *testing.T) {
	srv := startEtcd(t)
	cli := newClient(t, srv.Endpoint())
	reg := startRegistry(t, cli, fastOptions())

	put(t, cli, engineKey("", Mix, "127.0.0.1:8301"), engineMeta("127.0.0.1:8301", Mix, "m1").json(t))
	m1 := waitInst(t, reg.Registry, "127.0.0.1:8301", "mix 1", inState(Active))
	if m1.Type != Mix || m1.Role != Decode {
		t.Fatalf("first MIX: type/role %v/%v, want MIX/DECODE", m1.Type, m1.Role)
	}
	put(t, cli, engineKey("", Mix, "127.0.0.1:8302"), engineMeta("127.0.0.1:8302", Mix, "m2").json(t))
	if m2 := waitInst(t, reg.Registry, "127.0.0.1:8302", "mix 2", inState(Active)); m2.Role != Prefill {
		t.Fatalf("second MIX role %v, want PREFILL (a decode exists)", m2.Role)
	}
	if err := reg.SetRole("127.0.0.1:8301", Prefill); err != nil {
		t.Fatal(err)
	}
	put(t, cli, engineKey("", Mix, "127.0.0.1:8301"), engineMeta("127.0.0.1:8301", Mix, "m1").with("dp_size", 2).json(t))
	m1 = waitInst(t, reg.Registry, "127.0.0.1:8301", "refreshed", func(i Instance) bool { return i.Meta.DPSize == 2 })
	if m1.Role != Prefill {
		t.Errorf("refresh changed the role to %v", m1.Role)
	}
	if err := reg.SetRole("127.0.0.1:8301", Mix); err == nil {
		t.Error("SetRole accepted MIX as a role")
	}
	put(t, cli, engineKey("", Prefill, "127.0.0.1:8303"), engineMeta("127.0.0.1:8303", Prefill, "p").json(t))
	waitInst(t, reg.Registry, "127.0.0.1:8303", "prefill", inState(Active))
	if err := reg.SetRole("127.0.0.1:8303", Decode); err == nil {
		t.Error("SetRole changed a PREFILL instance")
	}
	if err := reg.SetRole("127.0.0.1:9", Decode); !errors.Is(err, ErrUnknownInstance) {
		t.Errorf("SetRole of an unknown instance: %v", err)
	}

	// On a listing, DECODE keys come first: a MIX then plays PREFILL.
	put(t, cli, engineKey("", Decode, "127.0.0.1:8304"), engineMeta("127.0.0.1:8304", Decode, "d").json(t))
	put(t, cli, engineKey("", Mix, "127.0.0.1:8300"), engineMeta("127.0.0.1:8300", Mix, "m0").json(t))
	other := startRegistry(t, cli, fastOptions())
	if in, _ := other.Lookup("127.0.0.1:8300"); in.Role != Prefill {
		t.Errorf("listed MIX beside a DECODE plays %v, want PREFILL", in.Role)
	}
}

// Invalid values never crash the registry and never replace a valid
// registration; each written value is warned about once.
func TestInvalidValuesIgnored(t *testing.T) {
	srv := startEtcd(t)
	cli := newClient(t, srv.Endpoint())
	logs := &testlog.Buffer{}
	opts := fastOptions()
	opts.Logger = logs.Logger(slog.LevelWarn)
	reg := startRegistry(t, cli, opts)

	bad := map[string]string{
		"127.0.0.1:8401": `{not json`,
		"127.0.0.1:8402": `{"rpc_address":"x","type":0}`,
		"127.0.0.1:8403": `{"name":"127.0.0.1:8403","type":0}`,
		"127.0.0.1:8404": `{"name":"127.0.0.1:8404","rpc_address":"x"}`,
		"127.0.0.1:8405": `{"name":"127.0.0.1:8405","rpc_address":"x","type":7}`,
		"127.0.0.1:8406": `{"name":"127.0.0.1:8406","rpc_address":"x","type":0,"dp_size":-1}`,
		"127.0.0.1:8407": `{"name":"127.0.0.1:8407","rpc_address":"x","type":"0"}`,
		"127.0.0.1:8408": `[]`,
	}
	for name, v := range bad {
		put(t, cli, engineKey("", Default, name), v)
	}
	good := "127.0.0.1:8410"
	key := engineKey("", Default, good)
	put(t, cli, key, engineMeta(good, Default, "g").json(t))
	waitInst(t, reg.Registry, good, "valid instance", inState(Active))
	if n := len(reg.Snapshot().Instances); n != 1 {
		t.Fatalf("%d instances, want only the valid one:\n%s", n, dump(reg.Snapshot()))
	}
	if n := logs.Count("ignoring instance value"); n != len(bad) {
		t.Errorf("%d warnings for %d bad values, want one each", n, len(bad))
	}

	put(t, cli, key, `{"name":`)
	put(t, cli, key, engineMeta(good, Default, "g").with("dp_size", 2).json(t))
	in := waitInst(t, reg.Registry, good, "dp 2", func(i Instance) bool { return i.Meta.DPSize == 2 })
	if in.State != Active || in.Incarnation() != "g" {
		t.Errorf("a bad value disturbed the instance: %+v", in)
	}

	// The value's own name does not override the key's.
	put(t, cli, engineKey("", Default, "127.0.0.1:8411"), engineMeta("10.9.9.9:1", Default, "n").json(t))
	waitInst(t, reg.Registry, "127.0.0.1:8411", "named by its key", inState(Active))
}

// Keys of another namespace, or outside any, are invisible.
func TestNamespaceIsolation(t *testing.T) {
	srv := startEtcd(t)
	cli := newClient(t, srv.Endpoint())
	opts := fastOptions()
	opts.Namespace = "team-a"
	a := startRegistry(t, cli, opts)
	plain := startRegistry(t, cli, fastOptions())

	put(t, cli, engineKey("team-b", Default, "127.0.0.1:8501"), engineMeta("127.0.0.1:8501", Default, "b").json(t))
	put(t, cli, engineKey("", Default, "127.0.0.1:8502"), engineMeta("127.0.0.1:8502", Default, "c").json(t))
	put(t, cli, "/team-a/XLLM:DEFAULT:127.0.0.1:8503", engineMeta("127.0.0.1:8503", Default, "a").json(t))
	waitInst(t, a.Registry, "127.0.0.1:8503", "own namespace", inState(Active))
	waitInst(t, plain.Registry, "127.0.0.1:8502", "no namespace", inState(Active))
	if s := a.Snapshot(); len(s.Instances) != 1 {
		t.Errorf("namespaced registry sees:\n%s", dump(s))
	}
	if s := plain.Snapshot(); len(s.Instances) != 1 {
		t.Errorf("registry without namespace sees:\n%s", dump(s))
	}
}

// Heartbeats are accepted only from the registered process; the HTTP
// layer answers both errors with 409.
func TestHeartbeatErrors(t *testing.T) {
	srv := startEtcd(t)
	cli := newClient(t, srv.Endpoint())
	reg := startRegistry(t, cli, fastOptions())
	if err := reg.Heartbeat(Heartbeat{Name: "127.0.0.1:1"}); !errors.Is(err, ErrUnknownInstance) {
		t.Errorf("unknown instance: %v", err)
	}
	put(t, cli, engineKey("", Default, "127.0.0.1:8600"), engineMeta("127.0.0.1:8600", Default, "cur").json(t))
	waitInst(t, reg.Registry, "127.0.0.1:8600", "active", inState(Active))
	for _, inc := range []string{"old", ""} {
		err := reg.Heartbeat(Heartbeat{Name: "127.0.0.1:8600", IncarnationID: inc, Load: &Load{WaitingRequests: 9}})
		if !errors.Is(err, ErrStaleIncarnation) {
			t.Errorf("incarnation %q: %v, want ErrStaleIncarnation", inc, err)
		}
	}
	if in, _ := reg.Lookup("127.0.0.1:8600"); in.HasLoad {
		t.Error("a rejected heartbeat's load was applied")
	}
	lat := Latency{RecentMaxTTFT: 120, RecentMaxTBT: 35}
	if err := reg.Heartbeat(Heartbeat{Name: "127.0.0.1:8600", IncarnationID: "cur", Latency: &lat}); err != nil {
		t.Fatal(err)
	}
	in, _ := reg.Lookup("127.0.0.1:8600")
	if !in.HasLatency || in.Latency != lat || in.HasLoad || in.LastHeartbeat.IsZero() {
		t.Errorf("after a latency-only heartbeat: %+v", in)
	}
}

// R-CAR-2, R-CAR-10: no load until the first report; the freshest of a
// heartbeat and the master's LOADMETRICS sync wins; an invalid
// heartbeat is refused and an invalid synced value marks the load
// unusable, neither stored; a sync value older than the incarnation is
// never applied.
func TestFreshestLoadWins(t *testing.T) {
	srv := startEtcd(t)
	cli := newClient(t, srv.Endpoint())
	reg := startRegistry(t, cli, fastOptions()) // no SelfAddr: never master
	name := "127.0.0.1:8700"
	loadKey := "XLLM:LOADMETRICS:" + name

	// A leftover value of a previous process on the same address.
	put(t, cli, loadKey, `{"waiting_requests_num":99,"gpu_cache_usage_perc":0.9}`)
	put(t, cli, engineKey("", Prefill, name), engineMeta(name, Prefill, "i1").json(t))
	in := waitInst(t, reg.Registry, name, "active", inState(Active))
	if in.HasLoad {
		t.Fatalf("a sync value older than the incarnation was applied: %+v", in.Load)
	}

	put(t, cli, loadKey, `{"waiting_requests_num":5,"gpu_cache_usage_perc":0.5}`)
	in = waitInst(t, reg.Registry, name, "synced load", func(i Instance) bool { return i.HasLoad })
	if in.Load != (Load{5, 0.5}) || in.LoadSource != LoadSync || !in.LoadUsable() {
		t.Fatalf("synced load %+v from %v", in.Load, in.LoadSource)
	}

	if err := reg.Heartbeat(Heartbeat{Name: name, IncarnationID: "i1", Load: &Load{7, 0.7}}); err != nil {
		t.Fatal(err)
	}
	if in, _ = reg.Lookup(name); in.Load != (Load{7, 0.7}) || in.LoadSource != LoadHeartbeat {
		t.Fatalf("heartbeat did not win over an older sync: %+v from %v", in.Load, in.LoadSource)
	}

	put(t, cli, loadKey, `{"waiting_requests_num":9,"gpu_cache_usage_perc":0.1}`)
	in = waitInst(t, reg.Registry, name, "newer sync", func(i Instance) bool { return i.Load.WaitingRequests == 9 })
	if in.LoadSource != LoadSync || in.Load.GPUCacheUsagePerc != 0.1 {
		t.Fatalf("newer sync: %+v from %v", in.Load, in.LoadSource)
	}

	// Issue 10: a heartbeat out of range is refused and replaces nothing.
	lastBeat := in.LastHeartbeat
	for _, bad := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), -0.5, 1.0000001} {
		err := reg.Heartbeat(Heartbeat{Name: name, IncarnationID: "i1", Load: &Load{1, bad}})
		if !errors.Is(err, ErrInvalidHeartbeat) || !strings.Contains(err.Error(), "gpu_cache_usage_perc") {
			t.Fatalf("usage %v: %v, want ErrInvalidHeartbeat naming gpu_cache_usage_perc", bad, err)
		}
		in, _ = reg.Lookup(name)
		if !in.LoadUsable() || in.Load != (Load{9, 0.1}) || in.LoadSource != LoadSync || !in.LastHeartbeat.Equal(lastBeat) {
			t.Fatalf("invalid usage %v changed the instance: %+v", bad, in)
		}
	}
	put(t, cli, loadKey, `{"waiting_requests_num":2,"gpu_cache_usage_perc":-1}`)
	in = waitInst(t, reg.Registry, name, "invalid sync", func(i Instance) bool { return !i.LoadValid })
	if in.LoadValid || in.Load != (Load{9, 0.1}) {
		t.Fatalf("invalid synced load stored: %+v", in)
	}
	if err := reg.Heartbeat(Heartbeat{Name: name, IncarnationID: "i1", Load: &Load{4, 0.4}}); err != nil {
		t.Fatal(err)
	}
	if in, _ = reg.Lookup(name); !in.LoadUsable() || in.Load != (Load{4, 0.4}) {
		t.Fatalf("valid report after an invalid one: %+v", in)
	}

	// The master dropping the entry removes a synced load, not a
	// heartbeat's.
	del(t, cli, loadKey)
	put(t, cli, engineKey("", Default, "127.0.0.1:8799"), engineMeta("127.0.0.1:8799", Default, "m").json(t))
	waitInst(t, reg.Registry, "127.0.0.1:8799", "marker", inState(Active))
	if in, _ = reg.Lookup(name); !in.HasLoad {
		t.Error("deleting the sync entry dropped a heartbeat load")
	}
	put(t, cli, loadKey, `{"waiting_requests_num":6,"gpu_cache_usage_perc":0.6}`)
	waitInst(t, reg.Registry, name, "sync again", func(i Instance) bool { return i.LoadSource == LoadSync })
	del(t, cli, loadKey)
	waitInst(t, reg.Registry, name, "sync entry deleted", func(i Instance) bool { return !i.HasLoad })

	// An unparsable sync value changes nothing.
	if err := reg.Heartbeat(Heartbeat{Name: name, IncarnationID: "i1", Load: &Load{3, 0.3}}); err != nil {
		t.Fatal(err)
	}
	put(t, cli, loadKey, `{"waiting_requests_num":"x"}`)
	put(t, cli, engineKey("", Default, "127.0.0.1:8798"), engineMeta("127.0.0.1:8798", Default, "m").json(t))
	waitInst(t, reg.Registry, "127.0.0.1:8798", "marker", inState(Active))
	if in, _ = reg.Lookup(name); in.Load != (Load{3, 0.3}) {
		t.Errorf("unparsable sync value applied: %+v", in.Load)
	}
}

// twoReplicas starts two registries on one etcd, each with its own
// client; A (10.0.0.1:9000) is master before B (10.0.0.2:9000) starts.
func twoReplicas(t *testing.T) (cliA, cliB *clientv3.Client, a, b *running, optsA, optsB Options) {
	t.Helper()
	srv := startEtcd(t)
	cliA = newClient(t, srv.Endpoint())
	cliB = newClient(t, srv.Endpoint())
	optsA = fastOptions()
	optsB = optsA
	optsA.SelfAddr, optsB.SelfAddr = "10.0.0.1:9000", "10.0.0.2:9000"
	a = startRegistry(t, cliA, optsA)
	waitMaster(t, a.Registry, true)
	b = startRegistry(t, cliB, optsB)
	return cliA, cliB, a, b, optsA, optsB
}

// R-CAR-11: two replicas on one etcd elect one master, whose address is
// the master key's value; each registers its service key; when the
// master stops, the other takes over within about the lease TTL.
func TestMasterElectionAndFailover(t *testing.T) {
	cliA, cliB, a, b, optsA, optsB := twoReplicas(t)

	ctx := ctxT(t)
	for _, key := range []string{"XLLM:SERVICE:10.0.0.1:9000", "XLLM:SERVICE:10.0.0.2:9000"} {
		waitKey(t, cliA, key, func(v string, ok bool) bool { return ok && v == key[len("XLLM:SERVICE:"):] })
	}
	if b.IsMaster() {
		t.Fatal("both replicas are master")
	}
	if v := getValue(t, cliA, "XLLM:SERVICE:MASTER"); v != optsA.SelfAddr {
		t.Fatalf("master key = %q, want %q", v, optsA.SelfAddr)
	}

	began := time.Now()
	a.stop(t)
	waitMaster(t, b.Registry, true)
	took := time.Since(began)
	t.Logf("failover after a clean stop took %v", took)
	if took > 2*optsB.MasterLeaseTTL+time.Second {
		t.Errorf("failover took %v, lease TTL %v", took, optsB.MasterLeaseTTL)
	}
	if v := getValue(t, cliB, "XLLM:SERVICE:MASTER"); v != optsB.SelfAddr {
		t.Fatalf("master key after failover = %q", v)
	}
	if resp, err := cliB.Get(ctx, "XLLM:SERVICE:10.0.0.1:9000"); err != nil || len(resp.Kvs) != 0 {
		t.Errorf("stopped replica's service key still there: %v %v", resp, err)
	}
}

// R-CAR-11: a master that vanishes without revoking (crash, network
// loss) is replaced once its lease lapses.
func TestMasterCrashFailover(t *testing.T) {
	cliA, _, a, b, _, _ := twoReplicas(t)

	began := time.Now()
	cliA.Close() // A can no longer keep its lease alive, nor revoke it
	waitMaster(t, a.Registry, false)
	t.Logf("crashed master stepped down after %v", time.Since(began))
	waitMaster(t, b.Registry, true)
	t.Logf("failover after a crash took %v", time.Since(began))
}

// R-CAR-10, R-CAR-11: the master writes the loads it receives to
// XLLM:LOADMETRICS, where the other replica picks them up; it deletes
// the entry of an instance that leaves.
func TestMasterSyncsLoads(t *testing.T) {
	cliA, cliB, a, b, _, _ := twoReplicas(t)

	name := deadAddr(t)
	key := engineKey("", Default, name)
	put(t, cliA, key, engineMeta(name, Default, "e").json(t))
	waitInst(t, a.Registry, name, "on master", inState(Active))
	waitInst(t, b.Registry, name, "on replica", inState(Active))
	if err := a.Heartbeat(Heartbeat{Name: name, IncarnationID: "e", Load: &Load{12, 0.375}}); err != nil {
		t.Fatal(err)
	}
	waitKey(t, cliB, "XLLM:LOADMETRICS:"+name, func(v string, ok bool) bool {
		return v == `{"waiting_requests_num":12,"gpu_cache_usage_perc":0.375}`
	})
	in := waitInst(t, b.Registry, name, "synced", func(i Instance) bool { return i.HasLoad })
	if in.Load != (Load{12, 0.375}) || in.LoadSource != LoadSync {
		t.Fatalf("replica load %+v from %v", in.Load, in.LoadSource)
	}
	if in, _ := a.Lookup(name); in.LoadSource != LoadHeartbeat {
		t.Errorf("master applied its own sync write: source %v", in.LoadSource)
	}

	// A new process on the address has no load: the master drops the entry.
	put(t, cliA, key, engineMeta(name, Default, "e2").json(t))
	waitKey(t, cliB, "XLLM:LOADMETRICS:"+name, func(_ string, ok bool) bool { return !ok })
	if in := waitInst(t, b.Registry, name, "replaced", func(i Instance) bool { return i.Incarnation() == "e2" }); in.HasLoad {
		t.Errorf("replaced instance has a load on the replica: %+v", in)
	}
	// Nothing of the cache metadata layout is ever written (R-DIR-3).
	if resp, err := cliA.Get(ctxT(t), "XLLM:CACHE:", clientv3.WithPrefix()); err != nil || len(resp.Kvs) != 0 {
		t.Errorf("XLLM:CACHE: keys: %v %v", resp, err)
	}
}

// The registry survives an etcd restart: it sees changes made after it,
// and the service keeps (or regains) its registration and mastership.
func TestEtcdRestart(t *testing.T) {
	srv := startEtcd(t)
	cli := newClient(t, srv.Endpoint())
	opts := fastOptions()
	opts.SelfAddr = "10.0.0.1:9000"
	reg := startRegistry(t, cli, opts)
	waitMaster(t, reg.Registry, true)
	put(t, cli, engineKey("", Default, "127.0.0.1:8800"), engineMeta("127.0.0.1:8800", Default, "a").json(t))
	waitInst(t, reg.Registry, "127.0.0.1:8800", "before restart", inState(Active))

	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	// Unable to renew its lease, the master steps down within the TTL
	// rather than claim a mastership it cannot prove.
	waitMaster(t, reg.Registry, false)
	// The snapshot keeps serving while etcd is down.
	if in, ok := reg.Lookup("127.0.0.1:8800"); !ok || in.State != Active {
		t.Fatalf("instance lost while etcd is down: %v %v", in, ok)
	}
	if err := srv.Start(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	put(t, cli, engineKey("", Prefill, "127.0.0.1:8801"), engineMeta("127.0.0.1:8801", Prefill, "b").json(t))
	waitInst(t, reg.Registry, "127.0.0.1:8801", "registered after restart", inState(Active))
	put(t, cli, engineKey("", Default, "127.0.0.1:8800"), engineMeta("127.0.0.1:8800", Default, "a").with("dp_size", 2).json(t))
	waitInst(t, reg.Registry, "127.0.0.1:8800", "changed after restart", func(i Instance) bool { return i.Meta.DPSize == 2 })
	waitMaster(t, reg.Registry, true)
	waitKey(t, cli, "XLLM:SERVICE:MASTER", func(v string, ok bool) bool { return v == opts.SelfAddr })
	waitKey(t, cli, "XLLM:SERVICE:"+opts.SelfAddr, func(v string, ok bool) bool { return ok })
}

// A watch that falls behind a compaction lists again and converges:
// additions, changes and removals made meanwhile all arrive.
func TestCompactionRelists(t *testing.T) {
	srv := startEtcd(t)
	cli := newClient(t, srv.Endpoint())
	reg := startRegistry(t, cli, fastOptions())
	kept, changed, gone := "127.0.0.1:8900", "127.0.0.1:8901", deadAddr(t)
	for _, n := range []string{kept, changed, gone} {
		put(t, cli, engineKey("", Default, n), engineMeta(n, Default, "x").json(t))
		waitInst(t, reg.Registry, n, "before", inState(Active))
	}

	srv.Partition()
	direct := newClient(t, srv.DirectEndpoint())
	added := "127.0.0.1:8903"
	put(t, direct, engineKey("", Default, added), engineMeta(added, Default, "y").json(t))
	put(t, direct, engineKey("", Default, changed), engineMeta(changed, Default, "x").with("dp_size", 8).json(t))
	del(t, direct, engineKey("", Default, gone))
	rev := put(t, direct, "unrelated", "bump")
	if _, err := direct.Compact(ctxT(t), rev); err != nil {
		t.Fatal(err)
	}
	if err := srv.Heal(); err != nil {
		t.Fatal(err)
	}

	waitInst(t, reg.Registry, added, "added during the partition", inState(Active))
	waitInst(t, reg.Registry, changed, "changed during the partition", func(i Instance) bool { return i.Meta.DPSize == 8 })
	waitInst(t, reg.Registry, gone, "deleted during the partition", inState(Suspect))
	if in, _ := reg.Lookup(kept); in.State != Active {
		t.Errorf("untouched instance is %v", in.State)
	}
}

func TestRunTwice(t *testing.T) {
	srv := startEtcd(t)
	cli := newClient(t, srv.Endpoint())
	reg := startRegistry(t, cli, fastOptions())
	if err := reg.Run(ctxT(t)); err == nil {
		t.Fatal("second Run succeeded")
	}
}

func TestNewValidates(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Error("New without a client succeeded")
	}
	srv := startEtcd(t)
	cli := newClient(t, srv.Endpoint())
	if _, err := New(Options{Client: cli, SelfAddr: "MASTER"}); err == nil {
		t.Error("SelfAddr MASTER accepted")
	}
	// A watch must be given time to answer the progress request it sends.
	if _, err := New(Options{Client: cli, WatchProgressInterval: time.Second, WatchStallTimeout: time.Second}); err == nil {
		t.Error("a stall timeout no longer than the progress interval accepted")
	}
	if _, err := New(Options{Client: cli, WatchStallTimeout: 500 * time.Millisecond}); err == nil {
		t.Error("a stall timeout under the default progress interval accepted")
	}
}

func waitMaster(t *testing.T, reg *Registry, want bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for reg.IsMaster() != want {
		if time.Now().After(deadline) {
			t.Fatalf("IsMaster stayed %v", !want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func getValue(t *testing.T, cli *clientv3.Client, key string) string {
	t.Helper()
	resp, err := cli.Get(ctxT(t), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return ""
	}
	return string(resp.Kvs[0].Value)
}

// waitKey polls key until pred holds for its value.
func waitKey(t *testing.T, cli *clientv3.Client, key string, pred func(v string, ok bool) bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		resp, err := cli.Get(ctxT(t), key)
		if err == nil {
			v, ok := "", len(resp.Kvs) > 0
			if ok {
				v = string(resp.Kvs[0].Value)
			}
			if pred(v, ok) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("key %s = %q (present %v)", key, v, ok)
			}
		} else if time.Now().After(deadline) {
			t.Fatalf("key %s: %v", key, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// R-CAR-10, R-CAR-11: a replica that becomes master starts from the
// loads its predecessor synced, keeps them published until it hears
// heartbeats, and then publishes those.
func TestNewMasterKeepsSyncedLoads(t *testing.T) {
	srv := startEtcd(t)
	cli := newClient(t, srv.Endpoint())
	name := "127.0.0.1:8950"
	loadKey := "XLLM:LOADMETRICS:" + name
	put(t, cli, engineKey("", Prefill, name), engineMeta(name, Prefill, "p").json(t))
	put(t, cli, loadKey, `{"waiting_requests_num":4,"gpu_cache_usage_perc":0.5}`)

	opts := fastOptions()
	opts.SelfAddr = "10.0.0.3:9000"
	reg := startRegistry(t, cli, opts)
	waitMaster(t, reg.Registry, true)
	in, _ := reg.Lookup(name)
	if in.Load != (Load{4, 0.5}) || in.LoadSource != LoadSync {
		t.Fatalf("new master did not adopt the synced load: %+v from %v", in.Load, in.LoadSource)
	}
	// Through several sync intervals the entry stays.
	for deadline := time.Now().Add(4 * opts.LoadSyncInterval); time.Now().Before(deadline); {
		if getValue(t, cli, loadKey) == "" {
			t.Fatal("new master deleted a load it had adopted")
		}
		time.Sleep(opts.LoadSyncInterval / 2)
	}
	if err := reg.Heartbeat(Heartbeat{Name: name, IncarnationID: "p", Load: &Load{1, 0.125}}); err != nil {
		t.Fatal(err)
	}
	waitKey(t, cli, loadKey, func(v string, ok bool) bool {
		return v == `{"waiting_requests_num":1,"gpu_cache_usage_perc":0.125}`
	})
	if in, _ := reg.Lookup(name); in.LoadSource != LoadHeartbeat || in.Load != (Load{1, 0.125}) {
		t.Errorf("master's own write overrode its heartbeat load: %+v from %v", in.Load, in.LoadSource)
	}
}
