package instance

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"
)

// Bounds of the retry delay after a failed listing or watch.
const (
	retryMin = 50 * time.Millisecond
	retryMax = 2 * time.Second
)

// listTimeout bounds one listing, so that an etcd that does not answer
// is logged and retried rather than waited for silently.
const listTimeout = 30 * time.Second

// errWatchStalled ends a watch that etcd stopped answering.
var errWatchStalled = errors.New("instance: watch stalled")

// watchLoop keeps the registry in step with etcd: list, then watch from
// the listed revision; whenever the watch cannot go on (compaction,
// cancellation by the server, a closed channel, a stall) list again.
// The snapshot stays as it was until a listing succeeds.
func (r *Registry) watchLoop(ctx context.Context) {
	delay := retryMin
	for ctx.Err() == nil {
		rev, err := r.list(ctx)
		if err == nil {
			began := time.Now()
			err = r.watch(ctx, rev)
			r.live.Store(false)
			if time.Since(began) > retryMax {
				delay = retryMin // it watched for a while: no backoff
			}
		}
		if ctx.Err() != nil {
			return
		}
		switch {
		case errors.Is(err, rpctypes.ErrCompacted):
			r.log.Info("instance watch compacted, listing again", "err", err)
			continue
		case errors.Is(err, errWatchStalled):
			// The listing has its own timeout; waiting first would only
			// add to the time the view is stale.
			r.stalls.Add(1)
			r.log.Warn("instance watch stalled, listing again; serving the last snapshot meanwhile", "err", err)
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
	r.listings.Add(1)
	r.contact(time.Now())
	r.live.Store(true)
	return resp.Header.Revision, nil
}

// watch applies changes after the listed revision until the watch
// ends, and says why.
//
// etcd answers nothing on an idle watch, and the client resumes a watch
// by itself across broken connections, so neither a silent channel nor
// a missing error means the watch is alive. A watch silent for
// progressEvery asks etcd for a progress notification, which etcd
// answers at once on a healthy stream; one that brings nothing for
// stallAfter, answers included, is abandoned as stalled.
func (r *Registry) watch(ctx context.Context, listed int64) error {
	// The client multiplexes watches with equal metadata onto one
	// stream; the registry's watch has a stream of its own, so that its
	// progress requests reach it alone (not the election's watch) and
	// abandoning it closes the stream: the stream ends with its last
	// watch, and the next watch opens a new one. The key is the same
	// for every watch, so that a stream RequestProgress may open after
	// the old one ended is the one the next watch takes, not one left
	// open until the client closes.
	wctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(clientv3.WithRequireLeader(ctx),
		watchStreamKey, "registry"))
	defer cancel()
	// The watch starts at the listed revision itself, whose changes the
	// listing already holds and which are skipped below: etcd drops a
	// progress request while a watch's start revision is ahead of its
	// own, so a watch from the next revision would go unanswered on an
	// idle cluster. Watch returns only once etcd has created the watch,
	// so a stall before that is bounded here: the timer ends the watch's
	// context, which makes Watch return.
	creating := time.AfterFunc(r.stallAfter, cancel)
	wch := r.cli.Watch(wctx, r.keys.rangeBeg,
		clientv3.WithRange(r.keys.rangeEnd), clientv3.WithRev(listed), clientv3.WithPrevKV())
	if !creating.Stop() {
		if err := ctx.Err(); err != nil {
			return err
		}
		return fmt.Errorf("instance: watch after revision %d not created within %v: %w", listed, r.stallAfter, errWatchStalled)
	}
	heard := time.Now() // etcd created the watch
	r.contact(heard)
	progress := time.NewTimer(r.progressEvery)
	defer progress.Stop()
	stall := time.NewTimer(r.stallAfter)
	defer stall.Stop()
	seen := listed // the revision the registry reflects
	for {
		select {
		case resp, ok := <-wch:
			if !ok {
				if err := ctx.Err(); err != nil {
					return err
				}
				return fmt.Errorf("instance: watch after revision %d closed", seen)
			}
			if err := resp.Err(); err != nil {
				return fmt.Errorf("instance: watch after revision %d: %w", seen, err)
			}
			if resp.Canceled {
				return fmt.Errorf("instance: watch after revision %d canceled by the server", seen)
			}
			heard = time.Now()
			r.contact(heard)
			progress.Reset(r.progressEvery)
			stall.Reset(r.stallAfter)
			events := resp.Events
			for len(events) > 0 && events[0].Kv.ModRevision <= listed {
				events = events[1:]
			}
			if len(events) == 0 {
				continue // a progress notification, or the listed revision again
			}
			r.applyEvents(events)
			seen = events[len(events)-1].Kv.ModRevision
		case <-progress.C:
			r.requestProgress(wctx)
			progress.Reset(r.progressEvery)
		case <-stall.C:
			return fmt.Errorf("instance: watch after revision %d: no answer for %v, not even to progress requests: %w",
				seen, time.Since(heard).Round(time.Millisecond), errWatchStalled)
		}
	}
}

// watchStreamKey is the metadata that gives the registry's watch a
// stream of its own; etcd ignores it.
const watchStreamKey = "kvcar-watch"

// requestProgress asks etcd for a progress notification on wctx's
// stream. The client hands the request over only while the stream is
// connected, so the wait is bounded: an unanswered request is what the
// stall timer is for.
func (r *Registry) requestProgress(wctx context.Context) {
	ctx, cancel := context.WithTimeout(wctx, r.progressEvery)
	defer cancel()
	if err := r.cli.RequestProgress(ctx); err != nil && wctx.Err() == nil {
		r.log.Debug("instance watch progress request not sent", "err", err)
	}
}

// contact records that etcd answered at t.
func (r *Registry) contact(t time.Time) { r.lastContact.Store(t.UnixNano()) }

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
