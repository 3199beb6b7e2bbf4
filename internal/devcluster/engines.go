package devcluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/kvcar/kvcar/internal/enginesim"
)

// Engines are emulated engines started together.
type Engines []*enginesim.Engine

// StartEngines creates and starts one engine per config, in order. On an
// error it closes the engines it already started.
func StartEngines(cfgs []enginesim.Config) (Engines, error) {
	var es Engines
	for i, c := range cfgs {
		e, err := enginesim.New(c)
		if err == nil {
			// A failed Start leaves the engine stopped: nothing to close.
			err = e.Start()
		}
		if err != nil {
			_ = es.Close()
			return nil, fmt.Errorf("engine %d: %w", i, err)
		}
		es = append(es, e)
	}
	return es, nil
}

// Streams is the number of event streams the engines publish, one per
// DP rank.
func (es Engines) Streams() int {
	n := 0
	for _, e := range es {
		n += e.DPSize()
	}
	return n
}

// Served returns what the engine that took a request over baidu_std
// reported about it, by the id its output carried: the id of the OpenAI
// answer kvcar wrote from that output.
func (es Engines) Served(reqID string) (enginesim.EngineUsage, bool) {
	for _, e := range es {
		if eu, ok := e.Served(reqID); ok {
			return eu, true
		}
	}
	return enginesim.EngineUsage{}, false
}

// Close closes every engine; an engine registered in etcd revokes its
// lease, so kvcar drops it at once.
func (es Engines) Close() error {
	var errs []error
	for _, e := range es {
		if err := e.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close engine %s: %w", e.Name(), err))
		}
	}
	return errors.Join(errs...)
}

// WaitHeartbeats waits until kvcar has accepted a heartbeat from every
// engine: CAR and SLO_AWARE schedule only instances with a load report.
func (es Engines) WaitHeartbeats(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pending := ""
		for _, e := range es {
			if st := e.LastHeartbeatStatus(); st != http.StatusOK {
				pending = fmt.Sprintf("engine %s: last heartbeat status %d", e.Name(), st)
				break
			}
		}
		if pending == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("heartbeats not accepted within %v: %s", timeout, pending)
		}
		if err := sleep(ctx, pollInterval); err != nil {
			return err
		}
	}
}

// pollInterval is how often the waits look again; queries with no token
// ids cost kvcar next to nothing.
const pollInterval = 20 * time.Millisecond

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
