package enginesim

import (
	"context"
	"encoding/json"
	"net/url"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// etcdStartTimeout bounds how long an embedded member may take to become
// ready on a slow machine.
const etcdStartTimeout = 20 * time.Second

// testEtcd is a single-member etcd running in the test process. Its ticks
// are short so that leases expire close to their TTL.
type testEtcd struct {
	endpoint string
	cli      *clientv3.Client
}

func startEtcd(t *testing.T) *testEtcd {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Name = "enginesim"
	cfg.Dir = t.TempDir()
	local, err := url.Parse("http://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*local}, []url.URL{*local}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*local}, []url.URL{*local}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.TickMs, cfg.ElectionMs = 10, 100
	cfg.UnsafeNoFsync = true
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	srv, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	select {
	case <-srv.Server.ReadyNotify():
	case err := <-srv.Err():
		t.Fatalf("embedded etcd failed: %v", err)
	case <-time.After(etcdStartTimeout):
		t.Fatalf("embedded etcd not ready after %v", etcdStartTimeout)
	}
	te := &testEtcd{endpoint: "http://" + srv.Clients[0].Addr().String()}
	te.cli, err = clientv3.New(clientv3.Config{
		Endpoints:   []string{te.endpoint},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { te.cli.Close() })
	return te
}

func (te *testEtcd) ctx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// get returns the value and lease of key, ok false when it is absent.
func (te *testEtcd) get(t *testing.T, key string) (value []byte, lease int64, ok bool) {
	t.Helper()
	resp, err := te.cli.Get(te.ctx(t), key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, false
	}
	return resp.Kvs[0].Value, resp.Kvs[0].Lease, true
}

// meta returns the InstanceMetaInfo JSON under key, failing when absent.
func (te *testEtcd) meta(t *testing.T, key string) map[string]any {
	t.Helper()
	v, _, ok := te.get(t, key)
	if !ok {
		t.Fatalf("key %s is absent", key)
	}
	var m map[string]any
	if err := json.Unmarshal(v, &m); err != nil {
		t.Fatalf("meta under %s is not JSON: %v: %s", key, err, v)
	}
	return m
}

func (te *testEtcd) put(t *testing.T, key, value string) {
	t.Helper()
	if _, err := te.cli.Put(te.ctx(t), key, value); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

// waitAbsent polls until key is gone and returns how long that took.
func (te *testEtcd) waitAbsent(t *testing.T, key string, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	waitFor(t, timeout, "key "+key+" to disappear", func() bool {
		_, _, ok := te.get(t, key)
		return !ok
	})
	return time.Since(start)
}

// waitFor polls cond until it holds, failing after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, timeout)
		}
		<-tick.C
	}
}
