package instance

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Bounds of the retry delay after a failed listing or watch.
const (
	retryMin = 50 * time.Millisecond
	retryMax = 2 * time.Second
)

// listTimeout bounds one listing, so that an etcd that does not answer
// is logged and retried rather than waited for silently.
const listTimeout = 30 * time.Second

// watchLoop keeps the registry in step with etcd: list, then watch from
// the listed revision; whenever the watch cannot go on (compaction,
// cancellation by the server, a closed channel) list again.
func (r *Registry) watchLoop(ctx context.Context) {
	delay := retryMin
	for ctx.Err() == nil {
		rev, err := r.list(ctx)
		if err == nil {
			began := time.Now()
			err = r.watch(ctx, rev)
			if time.Since(began) > retryMax {
				delay = retryMin // it watched for a while: no backoff
			}
		}
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, rpctypes.ErrCompacted) {
			r.log.Info("instance watch compacted, listing again", "err", err)
			continue
		}
		r.log.Warn("instance watch interrupted, listing again", "err", err, "retry_in", delay)
		if !wait(ctx, delay) {
			return
		}
		delay = min(2*delay, retryMax)
	}
}

// list reads the whole watched range and reconciles the registry with
// it; it returns the revision it reflects.
func (r *Registry) list(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	resp, err := r.cli.Get(ctx, r.keys.rangeBeg, clientv3.WithRange(r.keys.rangeEnd))
	if err != nil {
		return 0, fmt.Errorf("instance: list %s: %w", r.keys.rangeBeg, err)
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	present := make(map[string]bool, len(resp.Kvs))
	loads := make(map[string]bool)
	// Instances first, so that their loads find them.
	for _, kv := range resp.Kvs {
		if kind, t, name := r.keys.classify(string(kv.Key)); kind == keyInstance {
			present[string(kv.Key)] = true
			r.applyPut(t, name, kv, now)
		}
	}
	for _, kv := range resp.Kvs {
		if kind, _, name := r.keys.classify(string(kv.Key)); kind == keyLoad {
			loads[name] = true
			r.applySyncedLoad(name, kv, now)
		}
	}
	// A key that vanished while nobody watched was deleted.
	for name, e := range r.entries {
		if !present[e.key] {
			r.applyDelete(name, e.key, nil)
		}
	}
	for name := range r.synced {
		if !loads[name] {
			r.applySyncedDelete(name)
		}
	}
	if !r.listed {
		r.listed = true
		r.dirty = true
		r.log.Info("instance registry synced", "instances", len(r.entries), "revision", resp.Header.Revision)
	}
	r.flushLocked()
	return resp.Header.Revision, nil
}

// watch applies changes after rev until the watch ends, and says why.
func (r *Registry) watch(ctx context.Context, rev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := r.cli.Watch(wctx, r.keys.rangeBeg,
		clientv3.WithRange(r.keys.rangeEnd), clientv3.WithRev(rev+1), clientv3.WithPrevKV())
	for resp := range wch {
		if err := resp.Err(); err != nil {
			return fmt.Errorf("instance: watch from revision %d: %w", rev+1, err)
		}
		if resp.Canceled {
			return fmt.Errorf("instance: watch from revision %d canceled by the server", rev+1)
		}
		r.applyEvents(resp.Events)
		if len(resp.Events) > 0 {
			rev = resp.Events[len(resp.Events)-1].Kv.ModRevision
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return fmt.Errorf("instance: watch from revision %d closed", rev+1)
}

func (r *Registry) applyEvents(events []*clientv3.Event) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ev := range events {
		key := string(ev.Kv.Key)
		kind, t, name := r.keys.classify(key)
		switch {
		case kind == keyInstance && ev.Type == mvccpb.PUT:
			r.applyPut(t, name, ev.Kv, now)
		case kind == keyInstance && ev.Type == mvccpb.DELETE:
			var prev []byte
			if ev.PrevKv != nil {
				prev = ev.PrevKv.Value
			}
			r.applyDelete(name, key, prev)
		case kind == keyLoad && ev.Type == mvccpb.PUT:
			r.applySyncedLoad(name, ev.Kv, now)
		case kind == keyLoad && ev.Type == mvccpb.DELETE:
			r.applySyncedDelete(name)
		}
	}
	r.flushLocked()
}

// applySyncedLoad records a XLLM:LOADMETRICS value and, on a replica
// that is not the master, applies it as the freshest report.
func (r *Registry) applySyncedLoad(name string, kv *mvccpb.KeyValue, now time.Time) {
	l, err := parseLoadValue(kv.Value)
	if err != nil {
		r.warnValue(string(kv.Key), kv.ModRevision, "ignoring load metrics value", err)
		r.synced[name] = syncedLoad{rev: kv.ModRevision}
		return
	}
	r.synced[name] = syncedLoad{load: l, rev: kv.ModRevision, valid: true}
	e := r.entries[name]
	if e == nil || kv.ModRevision <= e.incRev || kv.ModRevision <= e.syncRev {
		return // no such instance, an older incarnation's, or already applied
	}
	if r.IsMaster() && e.inst.LoadSource == LoadHeartbeat {
		return // the master's own write of what it heard first hand
	}
	e.syncRev = kv.ModRevision
	r.setLoad(e, l, LoadSync, now)
}

// applySyncedDelete handles the master dropping an instance's load: a
// synced load is gone with it, a heartbeat's stays.
func (r *Registry) applySyncedDelete(name string) {
	delete(r.synced, name)
	if e := r.entries[name]; e != nil && e.inst.LoadSource == LoadSync {
		r.clearLoad(e)
	}
}

// warnValue logs a problem with a stored value once per written value,
// however often it is listed again.
func (r *Registry) warnValue(key string, rev int64, msg string, err error, attrs ...any) {
	if r.warned[key] == rev {
		return
	}
	r.warned[key] = rev
	attrs = append(attrs, "key", key, "mod_revision", rev)
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	r.log.Warn(msg, attrs...)
}
