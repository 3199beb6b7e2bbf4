package instance

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/testlog"
	"github.com/prometheus/client_golang/prometheus"
)

// stallOptions detects a stall within half a second, so that a test
// stall of a second or two is long.
func stallOptions() Options {
	o := fastOptions()
	o.WatchProgressInterval = 100 * time.Millisecond
	o.WatchStallTimeout = 500 * time.Millisecond
	return o
}

// waitWatch polls the registry's watch state until pred holds.
func waitWatch(t *testing.T, reg *Registry, what string, pred func(WatchState) bool) WatchState {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		ws := reg.WatchState()
		if pred(ws) {
			return ws
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: watch state stayed %+v", what, ws)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// gathered returns the value of every unlabelled series the registry's
// collector reports.
func gathered(t *testing.T, reg *Registry) map[string]float64 {
	t.Helper()
	pr := prometheus.NewRegistry()
	pr.MustRegister(reg.Collector())
	fams, err := pr.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) > 0 {
				continue
			}
			switch {
			case m.Gauge != nil:
				out[f.GetName()] = m.Gauge.GetValue()
			case m.Counter != nil:
				out[f.GetName()] = m.Counter.GetValue()
			}
		}
	}
	return out
}

// teeLogger sends warnings to logs and everything the test log level
// asks for to the test's own log.
func teeLogger(logs *testlog.Buffer) *slog.Logger {
	return slog.New(teeHandler{logs.Logger(slog.LevelWarn).Handler(), testLogger().Handler()})
}

type teeHandler struct{ a, b slog.Handler }

func (h teeHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.a.Enabled(ctx, l) || h.b.Enabled(ctx, l)
}

func (h teeHandler) Handle(ctx context.Context, r slog.Record) error {
	if h.a.Enabled(ctx, r.Level) {
		h.a.Handle(ctx, r.Clone())
	}
	if h.b.Enabled(ctx, r.Level) {
		h.b.Handle(ctx, r.Clone())
	}
	return nil
}

func (h teeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return teeHandler{h.a.WithAttrs(as), h.b.WithAttrs(as)}
}

func (h teeHandler) WithGroup(g string) slog.Handler {
	return teeHandler{h.a.WithGroup(g), h.b.WithGroup(g)}
}

// R-DISC-1, R-DISC-4: a network stall of the watch (connections open,
// nothing flowing) is detected within the stall timeout, counted and
// logged once; the registry keeps serving its last snapshot and taking
// heartbeats meanwhile; once the network is back it converges to what
// etcd holds: an instance added during the stall is there, a deleted
// one is gone, a changed value is applied. Heal drops the stalled
// connections, Resume lets them carry on; "defaults" measures the
// production intervals.
func TestWatchStallDetectedAndConverges(t *testing.T) {
	for _, tc := range []struct {
		name   string
		resume bool
		opts   func() Options
	}{
		{"Heal", false, stallOptions},
		{"Resume", true, stallOptions},
		{"defaults", false, func() Options {
			o := fastOptions()
			o.WatchProgressInterval, o.WatchStallTimeout = 0, 0
			return o
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startEtcd(t)
			direct := newClient(t, srv.DirectEndpoint())
			logs := &testlog.Buffer{}
			opts := tc.opts()
			opts.Logger = teeLogger(logs)
			reg := startRegistry(t, newClient(t, srv.Endpoint()), opts)
			stallAfter := orDefault(opts.WatchStallTimeout, DefaultWatchStallTimeout)

			kept, changed, gone, added := "127.0.0.1:9100", "127.0.0.1:9101", deadAddr(t), "127.0.0.1:9103"
			for _, n := range []string{kept, changed, gone} {
				put(t, direct, engineKey("", Default, n), engineMeta(n, Default, "x").json(t))
				waitInst(t, reg.Registry, n, "before the stall", inState(Active))
			}
			if err := reg.Heartbeat(Heartbeat{Name: kept, IncarnationID: "x", Load: &Load{1, 0.1}}); err != nil {
				t.Fatal(err)
			}
			before := waitWatch(t, reg.Registry, "live before the stall", func(ws WatchState) bool { return ws.Live })

			stalled := time.Now()
			srv.Stall()
			put(t, direct, engineKey("", Default, added), engineMeta(added, Default, "y").json(t))
			put(t, direct, engineKey("", Default, changed), engineMeta(changed, Default, "x").with("dp_size", 8).json(t))
			del(t, direct, engineKey("", Default, gone))

			during := waitWatch(t, reg.Registry, "stall detected", func(ws WatchState) bool { return ws.Stalls > 0 })
			detected := time.Since(stalled)
			t.Logf("stall detected %v after it began (stall timeout %v)", detected.Round(time.Millisecond), stallAfter)
			if during.Live {
				t.Error("watch state live after a stall was detected")
			}
			if detected > stallAfter+orDefault(opts.WatchProgressInterval, DefaultWatchProgressInterval)+time.Second {
				t.Errorf("stall detected after %v, stall timeout %v", detected, stallAfter)
			}
			// The last snapshot keeps serving: nothing of the stall's
			// changes, nothing lost.
			snap := reg.Snapshot()
			if _, ok := snap.Lookup(added); ok {
				t.Error("instance added during the stall seen before the network came back")
			}
			for _, n := range []string{kept, changed, gone} {
				if in, ok := snap.Lookup(n); !ok || in.State != Active || in.Meta.DPSize != 1 {
					t.Errorf("%s during the stall: %+v %v, want as before", n, in, ok)
				}
			}
			// Heartbeats do not go through etcd and still apply.
			if err := reg.Heartbeat(Heartbeat{Name: kept, IncarnationID: "x", Load: &Load{2, 0.2}}); err != nil {
				t.Fatal(err)
			}
			waitInst(t, reg.Registry, kept, "load of a heartbeat during the stall", func(i Instance) bool { return i.Load == (Load{2, 0.2}) })
			m := gathered(t, reg.Registry)
			if m["kvcar_instance_registry_synced"] != 0 || m["kvcar_instance_registry_watch_stalls_total"] != 1 {
				t.Errorf("metrics during the stall: %v", m)
			}
			if age := m["kvcar_instance_registry_contact_age_seconds"]; age < stallAfter.Seconds()*0.9 {
				t.Errorf("contact age %vs during the stall, want at least the stall timeout %v", age, stallAfter)
			}
			// Found once: the listing that follows waits for the network.
			time.Sleep(min(2*stallAfter, 1500*time.Millisecond))
			if ws := reg.WatchState(); ws.Stalls != 1 {
				t.Errorf("%d stalls counted for one", ws.Stalls)
			}
			if n := logs.Count("instance watch stalled"); n != 1 {
				t.Errorf("stall logged %d times, want once", n)
			}

			healed := time.Now()
			var err error
			if tc.resume {
				err = srv.Resume()
			} else {
				err = srv.Heal()
			}
			if err != nil {
				t.Fatal(err)
			}
			waitInst(t, reg.Registry, added, "added during the stall", inState(Active))
			waitInst(t, reg.Registry, changed, "changed during the stall", func(i Instance) bool { return i.Meta.DPSize == 8 })
			waitSnap(t, reg.Registry, "deleted during the stall", func(s *Snapshot) bool {
				in, ok := s.Lookup(gone)
				return !ok || in.State == Suspect
			})
			converged := time.Since(healed)
			after := waitWatch(t, reg.Registry, "live after the stall", func(ws WatchState) bool { return ws.Live })
			t.Logf("converged %v after the network came back (stall lasted %v)",
				converged.Round(time.Millisecond), healed.Sub(stalled).Round(time.Millisecond))
			if after.Listings <= before.Listings {
				t.Errorf("listings %d, before the stall %d: no listing after it", after.Listings, before.Listings)
			}
			if in, _ := reg.Lookup(kept); in.State != Active || in.Load != (Load{2, 0.2}) {
				t.Errorf("untouched instance after the stall: %+v", in)
			}
			if m := gathered(t, reg.Registry); m["kvcar_instance_registry_synced"] != 1 {
				t.Errorf("metrics after the stall: %v", m)
			}
			// The new watch works.
			put(t, direct, engineKey("", Default, "127.0.0.1:9104"), engineMeta("127.0.0.1:9104", Default, "z").json(t))
			waitInst(t, reg.Registry, "127.0.0.1:9104", "registered after the stall", inState(Active))
		})
	}
}

// A stall shorter than the stall timeout is ridden out: the watch goes
// on where it was, without a listing, whether the stalled connections
// carry on or are dropped (the client resumes the watch by itself).
func TestShortWatchStallNoRelist(t *testing.T) {
	for _, resume := range []bool{true, false} {
		name := "Heal"
		if resume {
			name = "Resume"
		}
		t.Run(name, func(t *testing.T) {
			srv := startEtcd(t)
			direct := newClient(t, srv.DirectEndpoint())
			opts := fastOptions()
			opts.WatchProgressInterval = 100 * time.Millisecond
			opts.WatchStallTimeout = 2 * time.Second
			reg := startRegistry(t, newClient(t, srv.Endpoint()), opts)
			before := waitWatch(t, reg.Registry, "live", func(ws WatchState) bool { return ws.Live })
			time.Sleep(3 * opts.WatchProgressInterval) // progress answered while idle

			srv.Stall()
			name := "127.0.0.1:9200"
			put(t, direct, engineKey("", Default, name), engineMeta(name, Default, "s").json(t))
			time.Sleep(5 * opts.WatchProgressInterval) // several progress requests go unanswered
			var err error
			if resume {
				err = srv.Resume()
			} else {
				err = srv.Heal()
			}
			if err != nil {
				t.Fatal(err)
			}
			waitInst(t, reg.Registry, name, "registered during the short stall", inState(Active))
			// Give a late stall time to show.
			time.Sleep(3 * opts.WatchProgressInterval)
			if ws := reg.WatchState(); ws.Stalls != 0 || ws.Listings != before.Listings || !ws.Live {
				t.Errorf("after a short stall: %+v, before %+v; want no stall and no listing", ws, before)
			}
		})
	}
}

// An idle, healthy watch keeps in contact through progress
// notifications, and is never taken for stalled.
func TestIdleWatchKeepsContact(t *testing.T) {
	srv := startEtcd(t)
	opts := stallOptions()
	reg := startRegistry(t, newClient(t, srv.Endpoint()), opts)
	for listed := time.Now().Add(5 * time.Second); !reg.WatchState().Live; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(listed) {
			t.Fatalf("registry never listed: %+v", reg.WatchState())
		}
	}
	deadline := time.Now().Add(6 * opts.WatchStallTimeout)
	worst := time.Duration(0)
	for time.Now().Before(deadline) {
		ws := reg.WatchState()
		worst = max(worst, time.Since(ws.LastContact))
		if !ws.Live || ws.Stalls != 0 || ws.Listings != 1 {
			t.Fatalf("idle watch: %+v", ws)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("longest silence of an idle watch %v (progress interval %v)", worst.Round(time.Millisecond), opts.WatchProgressInterval)
	if worst > opts.WatchStallTimeout {
		t.Errorf("idle watch silent for %v", worst)
	}
}
