package instance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// maxOpsPerTxn keeps a load sync transaction under etcd's default limit
// of 128 operations.
const maxOpsPerTxn = 100

var errLeaseLost = errors.New("instance: service lease lost")

// leaseLoop keeps the service registered and in the election, one
// lease at a time, until ctx ends.
func (r *Registry) leaseLoop(ctx context.Context) {
	delay := retryMin
	for ctx.Err() == nil {
		began := time.Now()
		err := r.holdLease(ctx)
		r.setMaster(false)
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) > time.Duration(r.leaseTTL)*time.Second {
			delay = retryMin // the lease lived for a while: no backoff
		}
		r.log.Warn("service lease ended, starting over with a new one", "err", err, "retry_in", delay)
		if !wait(ctx, delay) {
			return
		}
		delay = min(2*delay, retryMax)
	}
}

// holdLease grants a lease, keeps it alive, holds the service key and
// competes for the master key with it until the lease is lost or ctx
// ends. It revokes the lease on the way out so that another replica can
// take over at once.
func (r *Registry) holdLease(ctx context.Context) error {
	gctx, gcancel := context.WithTimeout(ctx, r.callTimeout)
	asked := time.Now()
	grant, err := r.cli.Grant(gctx, r.leaseTTL)
	gcancel()
	if err != nil {
		return fmt.Errorf("instance: grant service lease: %w", err)
	}
	lease := grant.ID
	r.leaseAlive(asked, grant.TTL)
	sctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer rcancel()
		if _, err := r.cli.Revoke(rctx, lease); err != nil {
			r.log.Debug("revoke service lease", "lease", lease, "err", err)
		}
	}()
	ka, err := r.cli.KeepAlive(sctx, lease)
	if err != nil {
		return fmt.Errorf("instance: keep service lease alive: %w", err)
	}
	ticker := time.NewTicker(r.syncEvery)
	defer ticker.Stop()

	for {
		rev, err := r.claim(sctx, lease)
		if err != nil {
			return err
		}
		if r.IsMaster() {
			r.writeLoads(sctx, lease)
		}
		wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(sctx))
		wch := r.cli.Watch(wctx, r.keys.service, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		err = r.hold(sctx, lease, ka, wch, ticker.C)
		wcancel()
		if err != nil {
			return err
		}
	}
}

// hold serves one claim: it keeps the lease's keep-alive drained, writes
// loads while master, and returns nil when a change of the service or
// master key calls for a new claim.
func (r *Registry) hold(ctx context.Context, lease clientv3.LeaseID, ka <-chan *clientv3.LeaseKeepAliveResponse,
	wch clientv3.WatchChan, tick <-chan time.Time) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case resp, ok := <-ka:
			if !ok {
				return errLeaseLost
			}
			// Counting the TTL from the answer's arrival overestimates
			// the lease by the answer's transit time: milliseconds
			// against a TTL of seconds.
			r.leaseAlive(time.Now(), resp.TTL)
		case resp, ok := <-wch:
			if !ok || resp.Err() != nil || resp.Canceled {
				return nil // claim again, which reads the truth, and watch anew
			}
			for _, ev := range resp.Events {
				if r.claimAffected(ev, lease) {
					return nil
				}
			}
		case <-tick:
			if r.IsMaster() {
				r.writeLoads(ctx, lease)
			}
		}
	}
}

// claimAffected reports whether ev may change this service's claim: a
// deletion of its own key or of the master key, or the master key
// changing hands.
func (r *Registry) claimAffected(ev *clientv3.Event, lease clientv3.LeaseID) bool {
	switch string(ev.Kv.Key) {
	case r.keys.self:
		return ev.Type == mvccpb.DELETE
	case r.keys.master:
		return ev.Type == mvccpb.DELETE || clientv3.LeaseID(ev.Kv.Lease) != lease
	}
	return false
}

// claim creates the service key and the master key if absent, bound to
// lease, and records whether this service is master. It returns the
// revision to watch from.
func (r *Registry) claim(ctx context.Context, lease clientv3.LeaseID) (int64, error) {
	svc, err := r.createIfAbsent(ctx, r.keys.self, lease)
	if err != nil {
		return 0, err
	}
	if svc.Succeeded {
		r.log.Debug("service registered", "key", r.keys.self)
	} else if holder := leaseOf(svc); holder != lease {
		// xllm-service refuses to start here; a replica that keeps
		// working is more useful, and the key comes back to it when the
		// other lease (usually this service's previous run) expires.
		r.log.Warn("service key held by another lease; waiting for it to expire",
			"key", r.keys.self, "lease", int64(holder))
	}
	m, err := r.createIfAbsent(ctx, r.keys.master, lease)
	if err != nil {
		return 0, err
	}
	r.setMaster(m.Succeeded || leaseOf(m) == lease)
	return min(svc.Header.Revision, m.Header.Revision), nil
}

func (r *Registry) createIfAbsent(ctx context.Context, key string, lease clientv3.LeaseID) (*clientv3.TxnResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, r.callTimeout)
	defer cancel()
	resp, err := r.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, r.self, clientv3.WithLease(lease))).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return nil, fmt.Errorf("instance: create %s: %w", key, err)
	}
	return resp, nil
}

// leaseOf is the lease of the key an Else(OpGet) read, 0 if none.
func leaseOf(resp *clientv3.TxnResponse) clientv3.LeaseID {
	if len(resp.Responses) == 0 {
		return 0
	}
	rr := resp.Responses[0].GetResponseRange()
	if rr == nil || len(rr.Kvs) == 0 {
		return 0
	}
	return clientv3.LeaseID(rr.Kvs[0].Lease)
}

// leaseAlive records that the service lease lives ttl seconds from at.
func (r *Registry) leaseAlive(at time.Time, ttl int64) {
	r.leaseUntil.Store(at.Add(time.Duration(ttl) * time.Second).UnixNano())
}

func (r *Registry) setMaster(m bool) {
	if r.master.Swap(m) != m {
		if m {
			r.log.Info("this service is now master", "self", r.self)
		} else {
			r.log.Info("this service is no longer master", "self", r.self)
		}
	}
}

// writeLoads writes every valid load to XLLM:LOADMETRICS and deletes the
// entries of instances without one. Each transaction holds only while
// the master key is still this lease's, so a deposed master writes
// nothing.
func (r *Registry) writeLoads(ctx context.Context, lease clientv3.LeaseID) {
	var ops []clientv3.Op
	r.mu.Lock()
	names := make([]string, 0, len(r.entries))
	for name := range r.entries {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		e := r.entries[name]
		if !e.inst.LoadUsable() {
			continue
		}
		v, err := encodeLoadValue(e.inst.Load)
		if err != nil {
			continue // a valid load always encodes
		}
		ops = append(ops, clientv3.OpPut(r.keys.loadKey(name), string(v)))
	}
	for name := range r.synced {
		if e := r.entries[name]; e == nil || !e.inst.LoadUsable() {
			ops = append(ops, clientv3.OpDelete(r.keys.loadKey(name)))
		}
	}
	r.mu.Unlock()

	for batch := range slices.Chunk(ops, maxOpsPerTxn) {
		tctx, cancel := context.WithTimeout(ctx, r.callTimeout)
		resp, err := r.cli.Txn(tctx).
			If(clientv3.Compare(clientv3.LeaseValue(r.keys.master), "=", lease)).
			Then(batch...).
			Commit()
		cancel()
		if err != nil {
			r.log.Warn("load sync failed", "err", err)
			return
		}
		if !resp.Succeeded {
			r.log.Info("load sync skipped: master key no longer held")
			return
		}
	}
}
