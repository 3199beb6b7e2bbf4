package instance

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvcar/kvcar/internal/etcdembed"
)

// waitLimit bounds every wait of a test for the registry to converge;
// the state machine's own timeouts below are a small fraction of it.
const waitLimit = 15 * time.Second

// Fast state machine timeouts, so that a whole walk through the states
// takes about a second.
func fastOptions() Options {
	return Options{
		LeaseLostGrace:   400 * time.Millisecond,
		SuspectTimeout:   700 * time.Millisecond,
		ProbeTimeout:     300 * time.Millisecond,
		ProbeAttempts:    2,
		MasterLeaseTTL:   time.Second,
		LoadSyncInterval: 200 * time.Millisecond,
	}
}

func testLogger() *slog.Logger {
	level := slog.LevelError
	if os.Getenv("KVCAR_TEST_LOG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

func startEtcd(t testing.TB) *etcdembed.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := etcdembed.Start(ctx, etcdembed.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

// newClient builds a client the way the service does.
func newClient(t testing.TB, endpoint string) *clientv3.Client {
	t.Helper()
	cfg, err := ClientConfig([]string{endpoint}, func(string) string { return "" }, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

type running struct {
	*Registry
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// stop ends Run and waits for it to return; later calls do nothing.
func (r *running) stop(t testing.TB) {
	t.Helper()
	r.once.Do(func() {
		r.cancel()
		select {
		case err := <-r.done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(waitLimit):
			t.Fatal("Run did not return after its context ended")
		}
	})
}

// startRegistry runs a registry on cli until the test ends.
func startRegistry(t testing.TB, cli *clientv3.Client, opts Options) *running {
	t.Helper()
	opts.Client = cli
	if opts.Logger == nil {
		opts.Logger = testLogger()
	}
	reg, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Registry: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- reg.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	waitSnap(t, reg, "initial listing", func(s *Snapshot) bool { return s.Synced })
	return r
}

// waitSnap waits until pred holds, and fails the test with the last
// snapshot if it does not within waitLimit.
func waitSnap(t testing.TB, reg *Registry, what string, pred func(*Snapshot) bool) *Snapshot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := reg.WaitFor(ctx, pred); err != nil {
		t.Fatalf("%s: %v; last snapshot:\n%s", what, err, dump(reg.Snapshot()))
	}
	return reg.Snapshot()
}

// waitInst waits until the named instance satisfies pred.
func waitInst(t *testing.T, reg *Registry, name, what string, pred func(Instance) bool) Instance {
	t.Helper()
	s := waitSnap(t, reg, name+": "+what, func(s *Snapshot) bool {
		in, ok := s.Lookup(name)
		return ok && pred(in)
	})
	in, _ := s.Lookup(name)
	return in
}

func waitGone(t *testing.T, reg *Registry, name string) {
	t.Helper()
	waitSnap(t, reg, name+" removed", func(s *Snapshot) bool {
		_, ok := s.Lookup(name)
		return !ok
	})
}

func inState(st State) func(Instance) bool { return func(i Instance) bool { return i.State == st } }

func dump(s *Snapshot) string {
	var b strings.Builder
	fmt.Fprintf(&b, "version %d synced %v\n", s.Version, s.Synced)
	for _, in := range s.Instances {
		fmt.Fprintf(&b, "  %s type=%v role=%v state=%v inc=%q dp=%d load=%v/%v/%+v src=%v\n",
			in.Meta.Name, in.Type, in.Role, in.State, in.Incarnation(), in.Meta.DPSize,
			in.HasLoad, in.LoadValid, in.Load, in.LoadSource)
	}
	return b.String()
}

// meta is an InstanceMetaInfo value as an engine writes it.
type meta map[string]any

func engineMeta(name string, t Type, incarnation string) meta {
	return meta{
		"name":           name,
		"rpc_address":    "127.0.0.1:19999",
		"type":           int(t),
		"incarnation_id": incarnation,
		"dp_size":        1,
		"cluster_ids":    []uint64{7},
		"addrs":          []string{"10.0.0.1"},
		"ports":          []int{9000},
	}
}

func (m meta) with(k string, v any) meta {
	n := make(meta, len(m)+1)
	for key, val := range m {
		n[key] = val
	}
	n[k] = v
	return n
}

func (m meta) json(t testing.TB) string {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	return ctx
}

// engineKey is where an engine of type typ named name registers.
func engineKey(ns string, typ Type, name string) string {
	return NormalizeNamespace(ns) + typePrefixes[typ] + name
}

// put writes a value without a lease.
func put(t *testing.T, cli *clientv3.Client, key, value string) int64 {
	t.Helper()
	resp, err := cli.Put(ctxT(t), key, value)
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// putLeased writes a value bound to a new lease of ttl seconds that
// nobody keeps alive: it lapses like a crashed engine's.
func putLeased(t *testing.T, cli *clientv3.Client, key, value string, ttl int64) clientv3.LeaseID {
	t.Helper()
	ctx := ctxT(t)
	g, err := cli.Grant(ctx, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, key, value, clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	return g.ID
}

func del(t *testing.T, cli *clientv3.Client, key string) {
	t.Helper()
	if _, err := cli.Delete(ctxT(t), key); err != nil {
		t.Fatal(err)
	}
}

// healthServer is an engine's business HTTP port: /health answers 200
// while healthy, 503 otherwise. Its address is the instance name.
type healthServer struct {
	*httptest.Server
	healthy atomic.Bool
	probes  atomic.Int64
}

func newHealthServer(t *testing.T) *healthServer {
	h := &healthServer{}
	h.healthy.Store(true)
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/health" {
			http.NotFound(w, req)
			return
		}
		h.probes.Add(1)
		if h.healthy.Load() {
			w.WriteHeader(http.StatusOK)
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(h.Close)
	return h
}

func (h *healthServer) name() string { return h.Listener.Addr().String() }

// deadAddr is an address nothing listens on: probes fail at once.
func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}
