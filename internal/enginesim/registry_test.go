package enginesim

import (
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

const (
	testTTL = time.Second
	// expiryWait bounds how long etcd may take to expire a 1 s lease: the
	// TTL, the lessor's check interval and a slow machine's slack.
	expiryWait = 6 * time.Second
)

// registeredEngine starts an engine on its own HTTP port that registers
// in te under namespace ns.
func registeredEngine(t *testing.T, te *testEtcd, ns string, typ InstanceType, mod func(*Config)) *Engine {
	t.Helper()
	cfg := Config{
		HTTPAddr: "127.0.0.1:0",
		Etcd: &EtcdConfig{
			Endpoints: []string{te.endpoint},
			Namespace: ns,
			Type:      typ,
			LeaseTTL:  testTTL,
		},
	}
	if mod != nil {
		mod(&cfg)
	}
	return startEngine(t, cfg)
}

// R-DISC-1, R-DISC-5: Start puts [/<ns>/]XLLM:<TYPE>:<name> with the
// InstanceMetaInfo JSON under a live lease of the configured TTL; Close
// revokes it and the key is gone at once.
func TestRegistersLeasedMetaRDISC5(t *testing.T) {
	te := startEtcd(t)
	e := registeredEngine(t, te, "ns1", TypePrefill, func(c *Config) {
		c.DPSize = 2
		c.DiscoveryOffsets = DefaultDiscoveryOffsets()
	})
	key := e.InstanceKey()
	if want := "/ns1/XLLM:PREFILL:" + e.HTTPAddr(); key != want {
		t.Fatalf("key %q, want %q", key, want)
	}
	if _, _, ok := te.get(t, "XLLM:PREFILL:"+e.HTTPAddr()); ok {
		t.Fatal("key registered outside the namespace")
	}
	_, lease, ok := te.get(t, key)
	if !ok || lease == 0 || lease != e.LeaseID() {
		t.Fatalf("key present %v with lease %x, engine holds %x", ok, lease, e.LeaseID())
	}
	ttl, err := te.cli.TimeToLive(te.ctx(t), clientv3.LeaseID(lease))
	must(t, err)
	if ttl.GrantedTTL != 1 || ttl.TTL < 0 {
		t.Fatalf("lease granted %d s, %d s left", ttl.GrantedTTL, ttl.TTL)
	}

	m := te.meta(t, key)
	inc, _ := m["incarnation_id"].(string)
	if _, err := hex.DecodeString(inc); err != nil || len(inc) != 32 || inc != e.IncarnationID() {
		t.Fatalf("incarnation_id %q, engine says %q", inc, e.IncarnationID())
	}
	ts, _ := m["register_ts_ms"].(float64)
	if now := time.Now().UnixMilli(); int64(ts) != e.RegisterTSMs() || int64(ts) > now || int64(ts) < now-60_000 {
		t.Fatalf("register_ts_ms %v, engine %d, now %d", m["register_ts_ms"], e.RegisterTSMs(), now)
	}
	for k, want := range map[string]any{
		"name": e.HTTPAddr(), "rpc_address": e.HTTPAddr(), "type": 1.0, "dp_size": 2.0,
		"block_size": float64(testBS), "backend_type": "xllm",
	} {
		if m[k] != want {
			t.Fatalf("meta %s = %v, want %v (meta %v)", k, m[k], want, m)
		}
	}
	if _, has := m["current_type"]; has {
		t.Fatal("current_type set without a mix role")
	}

	must(t, e.Close())
	if _, _, ok := te.get(t, key); ok {
		t.Fatal("key still present after Close")
	}
	if e.LeaseID() != 0 {
		t.Fatalf("closed engine holds lease %x", e.LeaseID())
	}
}

// R-DISC-5: the identity fields can be set or left out, and extra fields
// added, for the registry's fallbacks.
func TestMetaOverridesRDISC5(t *testing.T) {
	te := startEtcd(t)
	fixed := registeredEngine(t, te, "", TypeDefault, func(c *Config) {
		c.Etcd.IncarnationID = "inc-1"
		c.Etcd.RegisterTSMs = 42
	})
	m := te.meta(t, "XLLM:DEFAULT:"+fixed.Name())
	if m["incarnation_id"] != "inc-1" || m["register_ts_ms"] != 42.0 || m["type"] != 0.0 {
		t.Fatalf("meta %v", m)
	}

	bare := registeredEngine(t, te, "", TypeDecode, func(c *Config) {
		c.Etcd.OmitIncarnation = true
		c.Etcd.ExtraMeta = map[string]any{
			"register_ts_ms":      nil,
			"ttft_profiling_data": [][2]int{{128, 20}, {1024, 90}},
		}
	})
	m = te.meta(t, bare.InstanceKey())
	if _, has := m["incarnation_id"]; has {
		t.Fatalf("incarnation_id present: %v", m)
	}
	if _, has := m["register_ts_ms"]; has {
		t.Fatalf("register_ts_ms present: %v", m)
	}
	prof, _ := m["ttft_profiling_data"].([]any)
	if len(prof) != 2 || m["type"] != 2.0 {
		t.Fatalf("meta %v", m)
	}
}

// R-DISC-4: a lost lease deletes the key after the TTL while the engine
// keeps serving /health; Reregister brings the same incarnation back under
// a new lease.
func TestLoseLeaseExpiresKeyHealthStaysRDISC4(t *testing.T) {
	t.Parallel() // waits out a lease
	te := startEtcd(t)
	e := registeredEngine(t, te, "lost", TypePrefill, nil)
	key, inc, lease := e.InstanceKey(), e.IncarnationID(), e.LeaseID()

	must(t, e.LoseLease())
	if _, _, ok := te.get(t, key); !ok {
		t.Fatal("LoseLease deleted the key at once")
	}
	took := te.waitAbsent(t, key, expiryWait)
	if took < testTTL/2 {
		t.Fatalf("key gone after %v, before the lease could expire", took)
	}
	wantHealth(t, e.HTTPAddr(), http.StatusOK)

	must(t, e.Reregister())
	_, newLease, ok := te.get(t, key)
	if !ok || newLease == lease || newLease != e.LeaseID() {
		t.Fatalf("after Reregister: present %v lease %x (old %x, engine %x)", ok, newLease, lease, e.LeaseID())
	}
	if m := te.meta(t, key); m["incarnation_id"] != inc {
		t.Fatalf("Reregister changed incarnation %v -> %v", inc, m["incarnation_id"])
	}
}

// R-DISC-4: Deregister deletes the key at once, the engine keeps running,
// and Reregister restores it with the same identity.
func TestDeregisterReregisterRDISC4(t *testing.T) {
	te := startEtcd(t)
	e := registeredEngine(t, te, "dereg", TypeDefault, nil)
	key, inc := e.InstanceKey(), e.IncarnationID()
	must(t, e.Deregister())
	if _, _, ok := te.get(t, key); ok {
		t.Fatal("key present after Deregister")
	}
	if _, _, err := e.Prefill(0, tokens(0, testBS)); err != nil {
		t.Fatalf("deregistered engine stopped serving: %v", err)
	}
	wantHealth(t, e.HTTPAddr(), http.StatusOK)
	must(t, e.Reregister())
	if m := te.meta(t, key); m["incarnation_id"] != inc {
		t.Fatalf("incarnation %v after Reregister, want %v", m["incarnation_id"], inc)
	}
}

// R-DISC-5, R-CAR-7: Restart is a new process: a new incarnation_id and a
// later register_ts_ms overwrite the key under a new lease, and the key
// never disappears in between.
func TestRestartNewIncarnationRDISC5(t *testing.T) {
	te := startEtcd(t)
	e := registeredEngine(t, te, "restart", TypePrefill, nil)
	key, inc, ts, lease := e.InstanceKey(), e.IncarnationID(), e.RegisterTSMs(), e.LeaseID()
	wctx := te.ctx(t)
	w := te.cli.Watch(wctx, key)

	must(t, e.Restart())
	if e.IncarnationID() == inc || e.RegisterTSMs() <= ts || e.LeaseID() == lease {
		t.Fatalf("restart kept identity: %s/%d/%x", e.IncarnationID(), e.RegisterTSMs(), e.LeaseID())
	}
	m := te.meta(t, key)
	if m["incarnation_id"] != e.IncarnationID() || int64(m["register_ts_ms"].(float64)) != e.RegisterTSMs() {
		t.Fatalf("etcd has %v, engine %s/%d", m, e.IncarnationID(), e.RegisterTSMs())
	}
	for got := false; !got; {
		select {
		case wr := <-w:
			must(t, wr.Err())
			for _, ev := range wr.Events {
				if ev.Type != clientv3.EventTypePut {
					t.Fatalf("key %s deleted during restart", key)
				}
				got = true
			}
		case <-wctx.Done():
			t.Fatal("no PUT seen for the restart")
		}
	}
	// The old lease is retired: its expiry can no longer delete the key.
	ttl, err := te.cli.TimeToLive(te.ctx(t), clientv3.LeaseID(lease))
	must(t, err)
	if ttl.TTL != -1 {
		t.Fatalf("old lease still alive with %d s", ttl.TTL)
	}
}

// R-DISC-5: changing the DP size is a restart into another topology: the
// ranks follow the discovery rule for the new size and the meta says so.
func TestRestartWithDPSizeRDISC5(t *testing.T) {
	te := startEtcd(t)
	// Ports for two ranks are checked up front, so the restart into two
	// ranks finds its second rank's ports free.
	base, perr := FreeDiscoveryPort(2, DefaultEventPortOffset, DefaultReplayPortOffset)
	must(t, perr)
	e := registeredEngine(t, te, "dp", TypePrefill, func(c *Config) {
		c.HTTPAddr = fmt.Sprintf("127.0.0.1:%d", base)
		c.DiscoveryOffsets = DefaultDiscoveryOffsets()
	})
	inc := e.IncarnationID()
	wantEv, wantRp, err := DiscoveryEndpoints(e.HTTPAddr(), 2, DefaultEventPortOffset, DefaultReplayPortOffset)
	must(t, err)
	must(t, e.RestartWithDPSize(2))
	if e.DPSize() != 2 || e.IncarnationID() == inc {
		t.Fatalf("dp size %d incarnation %s (was %s)", e.DPSize(), e.IncarnationID(), inc)
	}
	got := []string{e.EventEndpoint(0), e.EventEndpoint(1), e.ReplayEndpoint(0), e.ReplayEndpoint(1)}
	if !slices.Equal(got, append(wantEv, wantRp...)) {
		t.Fatalf("endpoints %v, want %v %v", got, wantEv, wantRp)
	}
	if m := te.meta(t, e.InstanceKey()); m["dp_size"] != 2.0 || m["incarnation_id"] != e.IncarnationID() {
		t.Fatalf("meta %v", m)
	}
	p := newPeer(t, e, 1)
	_, _, err = e.Prefill(1, tokens(0, testBS))
	must(t, err)
	if m := p.liveOK(); m.seq != 0 || m.batch.DPRank != 1 {
		t.Fatalf("rank 1 seq %d rank %d", m.seq, m.batch.DPRank)
	}
	must(t, e.RestartWithDPSize(1))
	if _, _, err := e.Prefill(1, nil); err == nil {
		t.Fatal("rank 1 survived shrinking to one rank")
	}
}

// R-DISC-3, R-CAR-2: a MIX instance announces its current role in the
// optional current_type field; other types have no mix role.
func TestSetMixRoleRDISC3(t *testing.T) {
	te := startEtcd(t)
	e := registeredEngine(t, te, "", TypeMix, nil)
	key := e.InstanceKey()
	if m := te.meta(t, key); m["type"] != 3.0 || m["current_type"] != nil {
		t.Fatalf("meta %v", m)
	}
	must(t, e.SetMixRole(TypePrefill))
	if m := te.meta(t, key); m["current_type"] != 1.0 {
		t.Fatalf("meta %v after SetMixRole(PREFILL)", m)
	}
	_, lease, _ := te.get(t, key)
	must(t, e.SetMixRole(TypeDecode))
	if m := te.meta(t, key); m["current_type"] != 2.0 {
		t.Fatalf("meta %v after SetMixRole(DECODE)", m)
	}
	if _, l, _ := te.get(t, key); l != lease {
		t.Fatalf("role change moved the key from lease %x to %x", lease, l)
	}
	if err := e.SetMixRole(TypeMix); err == nil {
		t.Fatal("MIX accepted as a mix role")
	}
	p := registeredEngine(t, te, "", TypePrefill, nil)
	if err := p.SetMixRole(TypeDecode); err == nil {
		t.Fatal("PREFILL instance took a mix role")
	}
}

// A Start that cannot register fails cleanly and leaves nothing running.
func TestStartFailsWithoutEtcd(t *testing.T) {
	e, err := New(Config{
		HTTPAddr: "127.0.0.1:0",
		Etcd:     &EtcdConfig{Endpoints: []string{"http://127.0.0.1:1"}, RequestTimeout: 300 * time.Millisecond},
	})
	must(t, err)
	if err := e.Start(); err == nil {
		e.Close()
		t.Fatal("Start succeeded without etcd")
	}
	if _, _, err := e.Prefill(0, nil); !isNotRunning(err) {
		t.Fatalf("engine runs after failed Start: %v", err)
	}
	if _, _, err := httpGet(t, e.HTTPAddr(), "/health"); err == nil {
		t.Fatal("HTTP still served after failed Start")
	}
	must(t, e.Close())

	for _, cfg := range []Config{
		{Name: "a:1", Heartbeat: &HeartbeatConfig{}},
		{Etcd: &EtcdConfig{Endpoints: []string{"x"}}},
		{Name: "a:1", Etcd: &EtcdConfig{}},
		{Name: "a:1", Etcd: &EtcdConfig{Endpoints: []string{"x"}, Type: 4}},
	} {
		if _, err := New(cfg); err == nil {
			t.Fatalf("config %+v accepted", cfg)
		}
	}
}

// R-DISC-4, R-DISC-5: a reconciling engine notices its key is gone after
// a lost lease and puts it back with the same identity: the registry sees
// a DELETE and then a PUT of the same incarnation.
func TestReconcileRestoresRegistrationRDISC4(t *testing.T) {
	t.Parallel() // waits out a lease
	te := startEtcd(t)
	e := registeredEngine(t, te, "reconcile", TypePrefill, func(c *Config) {
		c.Etcd.ReconcileInterval = 50 * time.Millisecond
	})
	key, inc, lease := e.InstanceKey(), e.IncarnationID(), e.LeaseID()
	wctx := te.ctx(t)
	w := te.cli.Watch(wctx, key)
	must(t, e.LoseLease())
	var seen []string
	for len(seen) < 2 {
		select {
		case wr := <-w:
			must(t, wr.Err())
			for _, ev := range wr.Events {
				seen = append(seen, ev.Type.String())
			}
		case <-wctx.Done():
			t.Fatalf("events %v, want DELETE then PUT", seen)
		}
	}
	if seen[0] != "DELETE" || seen[1] != "PUT" {
		t.Fatalf("events %v, want DELETE then PUT", seen)
	}
	_, l, ok := te.get(t, key)
	if m := te.meta(t, key); !ok || m["incarnation_id"] != inc || l == lease {
		t.Fatalf("restored meta %v lease %x (old %x)", m, l, lease)
	}
	// The engine records its new lease just after the PUT lands.
	waitFor(t, time.Second, "the engine to record its new lease", func() bool { return e.LeaseID() == l })
	must(t, e.Deregister())
	waitFor(t, expiryWait, "the key back after Deregister", func() bool {
		_, _, ok := te.get(t, key)
		return ok
	})
}
