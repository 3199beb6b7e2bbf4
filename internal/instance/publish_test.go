package instance

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// registerN registers n DEFAULT instances and waits for them.
func registerN(t *testing.T, reg *Registry, cli *clientv3.Client, n int) []string {
	t.Helper()
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("10.1.%d.%d:8000", i/250, i%250+1)
		put(t, cli, engineKey("", Default, names[i]), engineMeta(names[i], Default, "inc").json(t))
	}
	waitSnap(t, reg, "all registered", func(s *Snapshot) bool { return len(s.Instances) == n })
	return names
}

// R-CAR-10: a heartbeat that only moves load values is published within
// LoadPublishDelay, together with the other heartbeats meanwhile, in
// one snapshot; one that makes a load usable is published at once.
func TestHeartbeatValuesCoalesced(t *testing.T) {
	srv := startEtcd(t)
	cli := newClient(t, srv.Endpoint())
	opts := fastOptions()
	opts.LoadPublishDelay = 300 * time.Millisecond
	reg := startRegistry(t, cli, opts)
	names := registerN(t, reg.Registry, cli, 16)

	for i, n := range names {
		if err := reg.Heartbeat(Heartbeat{Name: n, IncarnationID: "inc", Load: &Load{uint64(i), 0.5}}); err != nil {
			t.Fatal(err)
		}
		if in, _ := reg.Lookup(n); !in.LoadUsable() || in.Load.WaitingRequests != uint64(i) {
			t.Fatalf("first load of %s not published at once: %+v", n, in)
		}
	}

	v := reg.Snapshot().Version
	changed := reg.Changes()
	began := time.Now()
	for i, n := range names {
		if err := reg.Heartbeat(Heartbeat{Name: n, IncarnationID: "inc", Load: &Load{uint64(100 + i), 0.25}}); err != nil {
			t.Fatal(err)
		}
	}
	if s := reg.Snapshot(); s.Version != v {
		t.Fatalf("value-only heartbeats published at once: version %d, was %d", s.Version, v)
	}
	select {
	case <-changed:
	case <-time.After(waitLimit):
		t.Fatal("Changes did not fire for the deferred heartbeats")
	}
	took := time.Since(began)
	s := reg.Snapshot()
	t.Logf("16 value-only heartbeats published together after %v (delay %v)", took.Round(time.Millisecond), opts.LoadPublishDelay)
	if s.Version != v+1 {
		t.Errorf("version %d after one deferred publication, was %d", s.Version, v)
	}
	if took > opts.LoadPublishDelay+time.Second {
		t.Errorf("deferred heartbeats published after %v, delay %v", took, opts.LoadPublishDelay)
	}
	for i, n := range names {
		if in, _ := s.Lookup(n); in.Load != (Load{uint64(100 + i), 0.25}) || in.LastHeartbeat.Before(began) {
			t.Errorf("%s after the deferred publication: %+v", n, in)
		}
	}

	// An invalid report is refused: the published load stays usable.
	if err := reg.Heartbeat(Heartbeat{Name: names[0], IncarnationID: "inc", Load: &Load{1, -1}}); !errors.Is(err, ErrInvalidHeartbeat) {
		t.Fatalf("heartbeat with usage -1: %v, want ErrInvalidHeartbeat", err)
	}
	if in, _ := reg.Lookup(names[0]); !in.LoadUsable() || in.Load != (Load{100, 0.25}) {
		t.Errorf("a refused heartbeat changed the load: %+v", in)
	}
}

// Heartbeats from many goroutines, readers of every snapshot meanwhile:
// each snapshot is sorted and newer than the last, and once heartbeats
// stop the registry publishes every instance's last load.
func TestConcurrentHeartbeatsConverge(t *testing.T) {
	srv := startEtcd(t)
	cli := newClient(t, srv.Endpoint())
	opts := fastOptions()
	opts.LoadPublishDelay = 20 * time.Millisecond
	reg := startRegistry(t, cli, opts)
	names := registerN(t, reg.Registry, cli, 128)

	stop := make(chan struct{})
	var readers sync.WaitGroup
	errs := make(chan error, 4)
	for range 2 {
		readers.Go(func() {
			var last uint64
			for {
				select {
				case <-stop:
					return
				case <-reg.Changes():
				case <-time.After(waitLimit):
					errs <- fmt.Errorf("no snapshot for %v while heartbeats arrive", waitLimit)
					return
				}
				s := reg.Snapshot()
				if s.Version <= last {
					errs <- fmt.Errorf("version %d after %d", s.Version, last)
					return
				}
				last = s.Version
				if !slices.IsSortedFunc(s.Instances, func(a, b Instance) int { return strings.Compare(a.Meta.Name, b.Meta.Name) }) || len(s.Instances) != len(names) {
					errs <- fmt.Errorf("snapshot %d: %d instances, or not sorted by name", s.Version, len(s.Instances))
					return
				}
			}
		})
	}
	const writers, rounds = 4, 50
	v := reg.Snapshot().Version
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for r := range rounds {
				for i := w; i < len(names); i += writers {
					l := Load{WaitingRequests: uint64(r), GPUCacheUsagePerc: float64(i) / 1000}
					if err := reg.Heartbeat(Heartbeat{Name: names[i], IncarnationID: "inc", Load: &l}); err != nil {
						errs <- err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	waitSnap(t, reg.Registry, "every last load", func(s *Snapshot) bool {
		for i := range s.Instances {
			if s.Instances[i].Load.WaitingRequests != rounds-1 {
				return false
			}
		}
		return true
	})
	close(stop)
	readers.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d heartbeats, %d snapshots", rounds*len(names), reg.Snapshot().Version-v)
}
