package enginesim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// InstanceType is an engine's role as xLLM numbers it in etcd and in the
// InstanceMetaInfo JSON.
type InstanceType int

// The xLLM instance types.
const (
	TypeDefault InstanceType = 0
	TypePrefill InstanceType = 1
	TypeDecode  InstanceType = 2
	TypeMix     InstanceType = 3
)

// String returns the name used in etcd keys: DEFAULT, PREFILL, DECODE, MIX.
func (t InstanceType) String() string {
	switch t {
	case TypeDefault:
		return "DEFAULT"
	case TypePrefill:
		return "PREFILL"
	case TypeDecode:
		return "DECODE"
	case TypeMix:
		return "MIX"
	}
	return fmt.Sprintf("InstanceType(%d)", int(t))
}

// Registration defaults, as an xLLM engine has them.
const (
	DefaultLeaseTTL           = 3 * time.Second
	DefaultEtcdRequestTimeout = 2 * time.Second
)

// EtcdConfig describes how the engine registers itself.
type EtcdConfig struct {
	// Endpoints are the etcd client URLs; at least one is needed.
	Endpoints []string
	// Namespace prefixes every key as "/<Namespace>/" when not empty.
	Namespace string
	// Username and Password authenticate to etcd when both are set.
	Username, Password string
	// Type is the role registered: the key is XLLM:<Type>:<name>.
	Type InstanceType
	// IncarnationID identifies the first process start; empty generates a
	// random one. Every later start (Restart, Start after Close) is a new
	// process and always gets a new one.
	IncarnationID string
	// RegisterTSMs is register_ts_ms of the first start (0: now). Later
	// starts use now, kept strictly increasing.
	RegisterTSMs int64
	// LeaseTTL is the lease's time to live (DefaultLeaseTTL), rounded up
	// to whole seconds as etcd grants them.
	LeaseTTL time.Duration
	// RequestTimeout bounds every etcd request (DefaultEtcdRequestTimeout).
	RequestTimeout time.Duration
	// OmitIncarnation leaves incarnation_id out of the meta JSON and the
	// heartbeats, as older engines do.
	OmitIncarnation bool
	// ReconcileInterval, when positive, makes the engine check its key
	// that often and register again, same identity under a new lease,
	// when the key is gone: xLLM engines repair a lost registration this
	// way. With it, LoseLease and Deregister are followed by a return.
	ReconcileInterval time.Duration
	// ExtraMeta adds fields to the meta JSON or replaces generated ones
	// with the same key; a nil value removes the field, so that a test can
	// also drop register_ts_ms or send malformed values.
	ExtraMeta map[string]any
}

func (c *EtcdConfig) validate(name, httpAddr string) error {
	if c == nil {
		return nil
	}
	switch {
	case len(c.Endpoints) == 0:
		return errors.New("enginesim: Etcd.Endpoints is empty")
	case c.Type < TypeDefault || c.Type > TypeMix:
		return fmt.Errorf("enginesim: Etcd.Type %d is not an xLLM instance type", int(c.Type))
	case c.LeaseTTL < 0:
		return fmt.Errorf("enginesim: Etcd.LeaseTTL %v is negative", c.LeaseTTL)
	case c.RequestTimeout < 0:
		return fmt.Errorf("enginesim: Etcd.RequestTimeout %v is negative", c.RequestTimeout)
	case c.ReconcileInterval < 0:
		return fmt.Errorf("enginesim: Etcd.ReconcileInterval %v is negative", c.ReconcileInterval)
	case name == "" && httpAddr == "":
		return errors.New("enginesim: etcd registration needs a Name or an HTTPAddr")
	}
	return nil
}

func (c *EtcdConfig) leaseTTLSeconds() int64 {
	ttl := c.LeaseTTL
	if ttl == 0 {
		ttl = DefaultLeaseTTL
	}
	return max(1, int64((ttl+time.Second-1)/time.Second))
}

func (c *EtcdConfig) requestTimeout() time.Duration {
	if c.RequestTimeout == 0 {
		return DefaultEtcdRequestTimeout
	}
	return c.RequestTimeout
}

// keyPrefix is the optional "/<ns>/" in front of every xLLM key.
func keyPrefix(namespace string) string {
	ns := strings.Trim(namespace, "/")
	if ns == "" {
		return ""
	}
	return "/" + ns + "/"
}

// InstanceKey is the etcd key an engine of type t named name registers
// under: [/<ns>/]XLLM:<TYPE>:<name>.
func InstanceKey(namespace string, t InstanceType, name string) string {
	return keyPrefix(namespace) + "XLLM:" + t.String() + ":" + name
}

// MasterKey is the etcd key holding the master service's "host:port":
// [/<ns>/]XLLM:SERVICE:MASTER.
func MasterKey(namespace string) string {
	return keyPrefix(namespace) + "XLLM:SERVICE:MASTER"
}

// identity is what tells one process start from another (R-DISC-5).
type identity struct {
	incarnation string
	registerTS  int64
}

func newIncarnationID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("enginesim: incarnation id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// nextIdentity gives a new process start its identity: the configured one
// for the very first start, fresh ones afterwards. register_ts_ms only
// grows, so that it tells restarts apart even within one millisecond.
func (e *Engine) nextIdentity() (identity, error) {
	prev := e.ident.Load()
	var id identity
	if prev == nil && e.cfg.Etcd.IncarnationID != "" {
		id.incarnation = e.cfg.Etcd.IncarnationID
	} else {
		var err error
		if id.incarnation, err = newIncarnationID(); err != nil {
			return id, err
		}
	}
	if prev == nil && e.cfg.Etcd.RegisterTSMs != 0 {
		id.registerTS = e.cfg.Etcd.RegisterTSMs
	} else {
		id.registerTS = time.Now().UnixMilli()
		if prev != nil && id.registerTS <= prev.registerTS {
			id.registerTS = prev.registerTS + 1
		}
	}
	return id, nil
}

// IncarnationID returns the identity of the current process start; it is
// empty before the first Start of an engine without Etcd.
func (e *Engine) IncarnationID() string {
	if id := e.ident.Load(); id != nil {
		return id.incarnation
	}
	return ""
}

// RegisterTSMs returns register_ts_ms of the current process start.
func (e *Engine) RegisterTSMs() int64 {
	if id := e.ident.Load(); id != nil {
		return id.registerTS
	}
	return 0
}

// InstanceKey returns the etcd key the engine registers under, or "" when
// it does not register.
func (e *Engine) InstanceKey() string {
	if e.cfg.Etcd == nil {
		return ""
	}
	return InstanceKey(e.cfg.Etcd.Namespace, e.cfg.Etcd.Type, e.Name())
}

// LeaseID returns the etcd lease the registration is attached to, 0 when
// the engine holds none (not registered, or deregistered).
func (e *Engine) LeaseID() int64 {
	if r := e.reg.Load(); r != nil {
		return r.lease.Load()
	}
	return 0
}

// metaJSON renders the InstanceMetaInfo JSON an xLLM engine puts in etcd,
// empty lists included, since older services require them.
func (e *Engine) metaJSON(id identity) ([]byte, error) {
	name := e.Name()
	m := map[string]any{
		"name":                name,
		"rpc_address":         name,
		"type":                int(e.cfg.Etcd.Type),
		"incarnation_id":      id.incarnation,
		"register_ts_ms":      id.registerTS,
		"dp_size":             e.DPSize(),
		"block_size":          e.cfg.BlockSize,
		"backend_type":        "xllm",
		"cluster_ids":         []any{},
		"addrs":               []any{},
		"ports":               []any{},
		"kv_split_size":       1,
		"ttft_profiling_data": []any{},
		"tpot_profiling_data": []any{},
	}
	if role := e.mixRole.Load(); role != 0 {
		m["current_type"] = int(role)
	}
	if e.cfg.Etcd.OmitIncarnation {
		delete(m, "incarnation_id")
	}
	for k, v := range e.cfg.Etcd.ExtraMeta {
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("enginesim: %s: meta json: %w", name, err)
	}
	return b, nil
}

// registrar owns the etcd client of one running engine and the lease the
// registration hangs on. Its methods run under Engine.regMu, one at a
// time; lease is also read by LeaseID.
type registrar struct {
	cli     *clientv3.Client
	timeout time.Duration
	ttl     int64
	log     *slog.Logger

	lease  atomic.Int64 // 0: none
	kaStop context.CancelFunc
	kaDone chan struct{}
}

func newRegistrar(c *EtcdConfig, log *slog.Logger) (*registrar, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   c.Endpoints,
		DialTimeout: c.requestTimeout(),
		Username:    c.Username,
		Password:    c.Password,
		// The client's own logging is dropped: every failure it can have
		// comes back as an error that the engine logs with its context.
		Logger: zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("etcd client %v: %w", c.Endpoints, err)
	}
	return &registrar{cli: cli, timeout: c.requestTimeout(), ttl: c.leaseTTLSeconds(), log: log}, nil
}

// register puts key=value under a new lease and keeps that lease alive. A
// previous lease is retired afterwards: the key has moved to the new one,
// so revoking the old one deletes nothing and the key never disappears.
func (r *registrar) register(key string, value []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	g, err := r.cli.Grant(ctx, r.ttl)
	if err != nil {
		return fmt.Errorf("grant lease: %w", err)
	}
	if _, err := r.cli.Put(ctx, key, string(value), clientv3.WithLease(g.ID)); err != nil {
		_, _ = r.cli.Revoke(ctx, g.ID)
		return fmt.Errorf("put %s: %w", key, err)
	}
	old := r.lease.Swap(int64(g.ID))
	r.stopKeepAlive()
	if err := r.keepAlive(g.ID); err != nil {
		return err
	}
	if old != 0 {
		if err := r.revokeLease(clientv3.LeaseID(old)); err != nil {
			r.log.Warn("retiring old lease failed", "lease", old, "err", err)
		}
	}
	return nil
}

// update rewrites the value under the current lease; it does nothing when
// the engine holds no lease, since the next registration carries it.
func (r *registrar) update(key string, value []byte) error {
	id := r.lease.Load()
	if id == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	_, err := r.cli.Put(ctx, key, string(value), clientv3.WithLease(clientv3.LeaseID(id)))
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// The lease ran out after LoseLease: like the key, the value now
		// waits for the next registration.
		r.lease.CompareAndSwap(id, 0)
		return nil
	}
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	return nil
}

// keepAlive starts renewing id in a goroutine that lasts until
// stopKeepAlive, or until the lease is gone for good.
func (r *registrar) keepAlive(id clientv3.LeaseID) error {
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := r.cli.KeepAlive(ctx, id)
	if err != nil {
		cancel()
		return fmt.Errorf("keep lease %x alive: %w", int64(id), err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Responses must be drained or the client stalls the renewals.
		for range ch {
		}
		if ctx.Err() == nil {
			r.log.Warn("lease keepalive ended: the lease expired or etcd is unreachable", "lease", int64(id))
		}
	}()
	r.kaStop, r.kaDone = cancel, done
	return nil
}

// stopKeepAlive stops renewing without revoking: the lease then expires
// after its TTL, as when an engine hangs or loses etcd.
func (r *registrar) stopKeepAlive() {
	if r.kaStop == nil {
		return
	}
	r.kaStop()
	<-r.kaDone
	r.kaStop, r.kaDone = nil, nil
}

// revoke gives the current lease up now, which deletes the key.
func (r *registrar) revoke() error {
	r.stopKeepAlive()
	id := r.lease.Swap(0)
	if id == 0 {
		return nil
	}
	return r.revokeLease(clientv3.LeaseID(id))
}

func (r *registrar) revokeLease(id clientv3.LeaseID) error {
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	_, err := r.cli.Revoke(ctx, id)
	if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("revoke lease %x: %w", int64(id), err)
	}
	return nil
}

// close deregisters, as an engine shutting down cleanly does, and closes
// the client.
func (r *registrar) close() error {
	err := r.revoke()
	if cerr := r.cli.Close(); cerr != nil && !errors.Is(cerr, context.Canceled) {
		err = errors.Join(err, fmt.Errorf("close etcd client: %w", cerr))
	}
	return err
}

// register puts identity id under a new lease.
func (e *Engine) register(r *registrar, id identity) error {
	value, err := e.metaJSON(id)
	if err != nil {
		return err
	}
	if err := r.register(e.InstanceKey(), value); err != nil {
		return fmt.Errorf("enginesim: register %s: %w", e.Name(), err)
	}
	e.cfg.Logger.Info("registered", "engine", e.Name(), "key", e.InstanceKey(),
		"incarnation_id", id.incarnation, "lease", r.lease.Load())
	return nil
}

// registration returns the running engine's registrar. The caller holds
// regMu.
func (e *Engine) registration() (*registrar, error) {
	if e.cfg.Etcd == nil {
		return nil, fmt.Errorf("enginesim: %s: no Etcd configured", e.Name())
	}
	r := e.reg.Load()
	if r == nil {
		return nil, ErrNotRunning
	}
	return r, nil
}

// LoseLease stops renewing the lease without revoking it, so that etcd
// deletes the key once the TTL runs out while the engine, its HTTP server
// and its heartbeats go on (kvcar's LEASE_LOST).
func (e *Engine) LoseLease() error {
	e.regMu.Lock()
	defer e.regMu.Unlock()
	r, err := e.registration()
	if err != nil {
		return err
	}
	r.stopKeepAlive()
	return nil
}

// Deregister revokes the lease now: the key disappears at once while the
// engine keeps running.
func (e *Engine) Deregister() error {
	e.regMu.Lock()
	defer e.regMu.Unlock()
	r, err := e.registration()
	if err != nil {
		return err
	}
	if err := r.revoke(); err != nil {
		return fmt.Errorf("enginesim: deregister %s: %w", e.Name(), err)
	}
	return nil
}

// Reregister registers again under a new lease with the same identity, as
// an engine does after finding its key gone.
func (e *Engine) Reregister() error {
	e.regMu.Lock()
	defer e.regMu.Unlock()
	r, err := e.registration()
	if err != nil {
		return err
	}
	return e.register(r, *e.ident.Load())
}

// SetMixRole records the role a MIX instance currently plays, PREFILL or
// DECODE, in the optional meta field current_type and puts the meta again
// under the current lease. xllm-service decides that role itself and keeps
// it out of etcd; the field exists so that kvcar can be told the role.
func (e *Engine) SetMixRole(role InstanceType) error {
	if role != TypePrefill && role != TypeDecode {
		return fmt.Errorf("enginesim: mix role %v is neither PREFILL nor DECODE", role)
	}
	if e.cfg.Etcd == nil || e.cfg.Etcd.Type != TypeMix {
		return fmt.Errorf("enginesim: %s: only a MIX instance has a mix role", e.Name())
	}
	e.regMu.Lock()
	defer e.regMu.Unlock()
	e.mixRole.Store(int32(role))
	r := e.reg.Load()
	if r == nil {
		return nil
	}
	value, err := e.metaJSON(*e.ident.Load())
	if err != nil {
		return err
	}
	if err := r.update(e.InstanceKey(), value); err != nil {
		return fmt.Errorf("enginesim: %s: set mix role: %w", e.Name(), err)
	}
	return nil
}

// reconciler is the goroutine that puts the registration back when its key
// is gone. It belongs to the running engine and ends in stop.
type reconciler struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func (e *Engine) startReconciler(r *registrar, every time.Duration) *reconciler {
	ctx, cancel := context.WithCancel(context.Background())
	rc := &reconciler{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(rc.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := e.reconcile(ctx, r); err != nil && ctx.Err() == nil {
					r.log.Warn("reconciling the registration failed", "err", err)
				}
			}
		}
	}()
	return rc
}

func (rc *reconciler) stop() {
	rc.cancel()
	<-rc.done
}

// reconcile registers again when the key is missing. It holds regMu
// throughout, so that it never puts back an identity a restart has just
// replaced.
func (e *Engine) reconcile(ctx context.Context, r *registrar) error {
	e.regMu.Lock()
	defer e.regMu.Unlock()
	if e.reg.Load() != r {
		return nil
	}
	key := e.InstanceKey()
	gctx, cancel := context.WithTimeout(ctx, r.timeout)
	resp, err := r.cli.Get(gctx, key, clientv3.WithCountOnly())
	cancel()
	if err != nil {
		return fmt.Errorf("get %s: %w", key, err)
	}
	if resp.Count > 0 {
		return nil
	}
	r.log.Warn("registration missing in etcd, registering again", "key", key)
	return e.register(r, *e.ident.Load())
}
