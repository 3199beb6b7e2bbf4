package instance

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// applyPut applies the PUT (or listed value) of an instance key.
func (r *Registry) applyPut(t Type, name string, kv *mvccpb.KeyValue, now time.Time) {
	key := string(kv.Key)
	// The name becomes part of URLs and endpoints: a registration whose
	// key does not name a host:port is refused whatever its value says.
	if err := CheckName(name); err != nil {
		r.warnValue(key, kv.ModRevision, "ignoring instance registration", err)
		return
	}
	meta, err := parseMeta(kv.Value)
	if err != nil {
		r.warnValue(key, kv.ModRevision, "ignoring instance value", err, "instance", name)
		// The key now holds a registration kvcar refuses, perhaps a new
		// process's: the entry it replaced no longer describes what runs
		// there, so it stops being routed to rather than live on unchecked.
		if e := r.entries[name]; e != nil && e.key == key {
			r.log.Warn("instance withdrawn: its registration was replaced by one that is refused", "instance", name,
				"old_incarnation", e.inst.Incarnation())
			r.removeEntry(name)
			r.dirty = true
		}
		return
	}
	if meta.Name != name {
		// xllm-service names an instance by its key, whatever the value says.
		r.warnValue(key, kv.ModRevision, "instance value names another instance; using the key's name", nil, "value_name", meta.Name)
		meta.Name = name
	} else {
		delete(r.warned, key)
	}

	e := r.entries[name]
	switch {
	case e == nil:
		r.register(t, meta, kv, now)
	case e.inst.Incarnation() == meta.incarnation():
		r.refresh(e, t, meta, kv, now)
	default:
		r.log.Warn("instance replaced", "instance", name,
			"old_incarnation", e.inst.Incarnation(), "new_incarnation", meta.incarnation())
		r.removeEntry(name)
		r.register(t, meta, kv, now)
	}
}

func (r *Registry) register(t Type, meta Meta, kv *mvccpb.KeyValue, now time.Time) {
	e := &entry{
		key:    string(kv.Key),
		value:  kv.Value,
		incRev: kv.ModRevision,
		epoch:  r.nextEpoch(),
		inst: Instance{
			Meta:       meta,
			MetaGen:    r.nextMetaGen(),
			Type:       t,
			State:      Active,
			StateSince: now,
			Registered: now,
		},
	}
	e.inst.Role = r.roleFor(t, e)
	r.entries[meta.Name] = e
	r.orderStale = true
	// A load synced after this incarnation registered is its own; an
	// older one belongs to a previous process on the same address. A
	// master adopts it too: it is the previous master's latest view.
	if sl, ok := r.synced[meta.Name]; ok && sl.valid && sl.rev > e.incRev {
		r.setLoad(e, sl.load, LoadSync, now)
		e.syncRev = sl.rev
	}
	r.log.Info("instance registered", "instance", meta.Name, "type", t, "role", e.inst.Role,
		"incarnation", meta.incarnation(), "dp_size", meta.DPSize)
	r.dirty = true
}

// roleFor is the role that self, registering as type t, plays. A MIX
// instance plays DECODE until another instance does, as in xllm-service.
func (r *Registry) roleFor(t Type, self *entry) Type {
	if t != Mix {
		return t
	}
	for _, e := range r.entries {
		if e != self && e.inst.Role == Decode {
			return Prefill
		}
	}
	return Decode
}

func (r *Registry) refresh(e *entry, t Type, meta Meta, kv *mvccpb.KeyValue, now time.Time) {
	key := string(kv.Key)
	if bytes.Equal(e.value, kv.Value) && e.key == key && e.inst.Type == t && !e.keyGone && e.inst.State == Active {
		return // the same registration again, e.g. from a re-list
	}
	e.key, e.value = key, kv.Value
	e.inst.Meta, e.inst.MetaGen = meta, r.nextMetaGen()
	if e.inst.Type != t {
		e.inst.Type = t
		e.inst.Role = r.roleFor(t, e)
	}
	if e.keyGone || e.inst.State != Active {
		e.keyGone = false
		e.epoch = r.nextEpoch() // a probe still running answers nothing now
		r.setState(e, Active, now, "registration restored")
	}
	r.dirty = true
}

// applyDelete applies the DELETE of an instance key; prev is the
// deleted value when etcd returned it.
func (r *Registry) applyDelete(name, key string, prev []byte) {
	e := r.entries[name]
	delete(r.warned, key)
	if e == nil || e.key != key || e.keyGone {
		return
	}
	if len(prev) > 0 {
		if m, err := parseMeta(prev); err == nil && m.incarnation() != e.inst.Incarnation() {
			r.log.Info("ignoring stale delete of a replaced instance", "instance", name,
				"deleted_incarnation", m.incarnation(), "incarnation", e.inst.Incarnation())
			return
		}
	}
	e.keyGone = true
	e.epoch = r.nextEpoch()
	r.log.Info("instance key deleted, probing health", "instance", name)
	r.startProbe(name, e.epoch)
}

func (r *Registry) nextMetaGen() uint64 {
	r.lastMetaGen++
	return r.lastMetaGen
}

func (r *Registry) nextEpoch() uint64 {
	r.lastEpoch++
	return r.lastEpoch
}

// startProbe probes name's health off the caller's goroutine: the watch
// must never wait on an engine.
func (r *Registry) startProbe(name string, epoch uint64) {
	ctx := r.runCtx
	r.probes.Go(func() {
		ok := r.probe(ctx, name)
		r.mu.Lock()
		defer r.mu.Unlock()
		r.probeDone(name, epoch, ok, time.Now())
		r.flushLocked()
	})
}

func (r *Registry) probeDone(name string, epoch uint64, ok bool, now time.Time) {
	e := r.entries[name]
	if e == nil || e.epoch != epoch || !e.keyGone {
		return // a PUT, another DELETE or a removal came first
	}
	if ok {
		r.setState(e, LeaseLost, now, "lease deleted, health probe succeeded")
		e.graceFrom = now
	} else {
		r.setState(e, Suspect, now, "lease deleted, health probe failed")
	}
	r.dirty = true
	r.kickTimer()
}

// probe reports whether http://<name>/health answers 200 within
// ProbeAttempts attempts.
func (r *Registry) probe(ctx context.Context, name string) bool {
	url := "http://" + name + "/health"
	backoff := min(100*time.Millisecond, r.probeTimeout)
	for attempt := 1; attempt <= r.probeAttempts; attempt++ {
		status, err := r.probeOnce(ctx, url)
		if err == nil && status == http.StatusOK {
			return true
		}
		r.log.Warn("health probe failed", "instance", name, "attempt", attempt, "of", r.probeAttempts,
			"status", status, "err", err)
		if attempt < r.probeAttempts && !wait(ctx, backoff) {
			return false
		}
	}
	return false
}

func (r *Registry) probeOnce(ctx context.Context, url string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, r.probeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := r.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	return resp.StatusCode, nil
}

func (r *Registry) setState(e *entry, s State, now time.Time, why string) {
	if e.inst.State == s {
		return
	}
	r.log.Info("instance state changed", "instance", e.inst.Meta.Name, "from", e.inst.State, "to", s, "why", why)
	e.inst.State = s
	e.inst.StateSince = now
	r.dirty = true
}

// setLoad records a load report; an invalid one only marks the load
// invalid.
func (r *Registry) setLoad(e *entry, l Load, src LoadSource, now time.Time) {
	e.inst.HasLoad = true
	e.inst.LoadValid = validLoad(l)
	if e.inst.LoadValid {
		e.inst.Load = l
	} else {
		r.log.Warn("invalid load report", "instance", e.inst.Meta.Name, "source", src,
			"gpu_cache_usage_perc", l.GPUCacheUsagePerc)
	}
	e.inst.LoadUpdated = now
	e.inst.LoadSource = src
	r.dirty = true
}

func (r *Registry) clearLoad(e *entry) {
	e.inst.HasLoad, e.inst.LoadValid = false, false
	e.inst.Load = Load{}
	e.inst.LoadSource = LoadNone
	r.dirty = true
}

// timerLoop moves instances along the state machine's timeouts and
// publishes the changes heartbeats deferred.
func (r *Registry) timerLoop(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		r.mu.Lock()
		now := time.Now()
		next := r.expireLocked(now)
		if !r.deferredSince.IsZero() {
			if due := r.deferredSince.Add(r.publishDelay); now.Before(due) {
				if next.IsZero() || due.Before(next) {
					next = due
				}
			} else {
				r.dirty = true
			}
		}
		r.flushLocked()
		r.mu.Unlock()
		d := time.Hour
		if !next.IsZero() {
			d = max(0, time.Until(next))
		}
		t.Reset(d)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.kick:
		}
	}
}

// expireLocked applies every timeout due at now and returns the next
// deadline, zero if none.
func (r *Registry) expireLocked(now time.Time) time.Time {
	var next time.Time
	soonest := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	for name, e := range r.entries {
		switch e.inst.State {
		case LeaseLost:
			due := e.graceFrom
			if e.inst.LastHeartbeat.After(due) {
				due = e.inst.LastHeartbeat
			}
			due = due.Add(r.grace)
			if now.Before(due) {
				soonest(due)
				continue
			}
			r.setState(e, Suspect, now, "no heartbeat within the lease-lost grace")
			soonest(now.Add(r.suspectAfter))
		case Suspect:
			due := e.inst.StateSince.Add(r.suspectAfter)
			if now.Before(due) {
				soonest(due)
				continue
			}
			r.removeEntry(name)
			r.log.Warn("suspect instance removed", "instance", name, "incarnation", e.inst.Incarnation())
			r.dirty = true
		}
	}
	return next
}
