package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/kvcar/kvcar/internal/instance"
	"github.com/kvcar/kvcar/internal/server"
)

// readyStep is one condition of readiness.
type readyStep struct {
	// waitingFor is what /ready says while the step is not done.
	waitingFor string
	// changed returns a channel closed when done may have changed; it is
	// taken before done is asked, so that no change is missed between.
	changed func() <-chan struct{}
	done    func() bool
}

// readinessSteps are the conditions under which kvcar's answers reflect
// the cluster: the registry has completed its first etcd listing (before
// it, there are no instances to route to and every query would say "no
// streams"), and with discovery the directory has streams for what that
// listing holds. The directory itself, with any static streams, is built
// before the listeners serve.
func readinessSteps(reg *instance.Registry, discovered <-chan struct{}) []readyStep {
	steps := []readyStep{{
		waitingFor: "waiting for the instance registry's first listing of etcd",
		changed:    reg.Changes,
		done:       func() bool { return reg.Snapshot().Synced },
	}}
	if discovered != nil {
		steps = append(steps, readyStep{
			waitingFor: "waiting for the first discovery pass over the instance registry",
			changed:    func() <-chan struct{} { return discovered },
			done: func() bool {
				select {
				case <-discovered:
					return true
				default:
					return false
				}
			},
		})
	}
	return steps
}

// notReadyWarnEvery is how often a service that is still not ready says
// so in the log, naming what it waits for.
const notReadyWarnEvery = 10 * time.Second

// awaitReady keeps srv not ready, with the reason, until every step is
// done, then makes it ready. It returns when ctx ends. Readiness is kept
// once reached: later etcd trouble is served from the last snapshot, and
// taking every replica out of its load balancer then would turn an etcd
// outage into a full one.
func awaitReady(ctx context.Context, srv *server.Server, steps []readyStep, log *slog.Logger) {
	began := time.Now()
	tick := time.NewTicker(notReadyWarnEvery)
	defer tick.Stop()
	for _, st := range steps {
		srv.SetNotReady(st.waitingFor)
		for {
			ch := st.changed()
			if st.done() {
				break
			}
			select {
			case <-ch:
			case <-tick.C:
				log.Warn("kvcar is not ready", "reason", st.waitingFor, "since", time.Since(began).Round(time.Second))
			case <-ctx.Done():
				return
			}
		}
	}
	srv.SetReady(true)
	log.Info("kvcar ready", "after", time.Since(began).Round(time.Millisecond))
}
