package instance

import (
	"errors"
	"math"
	"strconv"
	"time"
)

// Type is an instance type, numbered as xllm-service's InstanceType.
type Type int

// Instance types.
const (
	Default Type = 0
	Prefill Type = 1
	Decode  Type = 2
	Mix     Type = 3
)

var typeNames = [...]string{Default: "DEFAULT", Prefill: "PREFILL", Decode: "DECODE", Mix: "MIX"}

// String returns the name used in etcd keys, for example "PREFILL".
func (t Type) String() string {
	if t >= 0 && int(t) < len(typeNames) {
		return typeNames[t]
	}
	return "Type(" + strconv.Itoa(int(t)) + ")"
}

func (t Type) valid() bool { return t >= Default && t <= Mix }

// State is an instance's runtime state (WIRE.md, instance state machine).
type State int

// Runtime states.
const (
	// Active: the instance's etcd key exists.
	Active State = iota
	// LeaseLost: the key is gone but the instance answered its health
	// probe or keeps sending heartbeats; it stays schedulable.
	LeaseLost
	// Suspect: the key is gone and the instance is presumed dead; it is
	// not schedulable and is removed after the suspect timeout.
	Suspect
)

var stateNames = [...]string{Active: "ACTIVE", LeaseLost: "LEASE_LOST", Suspect: "SUSPECT"}

func (s State) String() string {
	if s >= 0 && int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// Meta is an engine's InstanceMetaInfo as registered in etcd. Slices are
// shared between snapshots and must not be modified.
type Meta struct {
	// Name is the business HTTP address "ip:port": the key's suffix.
	Name string
	// RPCAddress is the engine's brpc address.
	RPCAddress string
	// Type is the type written in the value; Instance.Type, from the
	// key, is the one that counts.
	Type Type
	// IncarnationID identifies the engine process, when it sends one.
	IncarnationID string
	// RegisterTsMs is the registration time in Unix milliseconds, 0
	// when absent.
	RegisterTsMs int64
	// DPSize is the number of data-parallel ranks, at least 1.
	DPSize      int
	ClusterIDs  []uint64
	Addrs       []string
	Ports       []uint16
	KVSplitSize int
	TTFTProfile []TTFTPoint
	TPOTProfile []TPOTPoint
	// BackendType is "xllm" unless the value says otherwise.
	BackendType string
}

// TTFTPoint is one entry of ttft_profiling_data: [input_len, ttft_ms].
type TTFTPoint struct {
	InputLen int
	TTFTMs   float64
}

// TPOTPoint is one entry of tpot_profiling_data:
// [avg_len, batch_size, tpot_ms].
type TPOTPoint struct {
	AvgLen    int
	BatchSize int
	TPOTMs    float64
}

// incarnation is the identity rule of R-DISC-5 and R-CAR-7.
func (m *Meta) incarnation() string {
	if m.IncarnationID != "" {
		return m.IncarnationID
	}
	if m.RegisterTsMs != 0 {
		return strconv.FormatInt(m.RegisterTsMs, 10)
	}
	return ""
}

// Load is one load report (LoadMetrics in the heartbeat proto).
type Load struct {
	WaitingRequests   uint64
	GPUCacheUsagePerc float64
}

// Latency is one latency report (LatencyMetrics in the heartbeat
// proto). The engine reports whole milliseconds as int64.
type Latency struct {
	RecentMaxTTFT int64 // ms
	RecentMaxTBT  int64 // ms
}

// LoadSource says where an instance's current load came from.
type LoadSource int

// Load sources.
const (
	LoadNone      LoadSource = iota
	LoadHeartbeat            // a heartbeat received by this replica
	LoadSync                 // the master's XLLM:LOADMETRICS entry
)

func (s LoadSource) String() string {
	switch s {
	case LoadHeartbeat:
		return "heartbeat"
	case LoadSync:
		return "sync"
	}
	return "none"
}

// Instance is the registry's view of one engine instance.
type Instance struct {
	Meta Meta
	// MetaGen names Meta's value in its registry: two Instances of one
	// registry with the same MetaGen have the same Meta, so a reader
	// that derived something from Meta can tell it still holds by this
	// word alone. The registry gives every registration and every change
	// of one a new MetaGen; 0, as in an Instance made by hand, promises
	// nothing.
	MetaGen uint64
	// Type is the type of the key the instance is registered under.
	Type Type
	// Role is what a MIX instance currently plays, Prefill or Decode;
	// for other types it equals Type.
	Role  Type
	State State
	// StateSince is when State was entered.
	StateSince time.Time
	// Registered is when this incarnation was first seen.
	Registered time.Time

	// HasLoad is false until the first load report of this incarnation.
	HasLoad bool
	// LoadValid is false when the latest report was invalid; Load then
	// holds the last valid report, if any.
	LoadValid   bool
	Load        Load
	LoadUpdated time.Time
	LoadSource  LoadSource

	HasLatency    bool
	Latency       Latency
	LastHeartbeat time.Time
}

// Name is the instance's business HTTP address, its identity in the
// registry.
func (i *Instance) Name() string { return i.Meta.Name }

// Incarnation is the instance's process identity: incarnation_id, else
// register_ts_ms in decimal, else "".
func (i *Instance) Incarnation() string { return i.Meta.incarnation() }

// Schedulable reports whether requests may be routed to the instance:
// every state but SUSPECT.
func (i *Instance) Schedulable() bool { return i.State != Suspect }

// LoadUsable reports whether the instance has a valid load report, as
// load-aware routing requires (R-CAR-2).
func (i *Instance) LoadUsable() bool { return i.HasLoad && i.LoadValid }

// routingView is what decides whether routing may use an instance,
// beyond its load and latency values.
type routingView struct {
	state      State
	hasLoad    bool
	loadValid  bool
	source     LoadSource
	hasLatency bool
}

func (i *Instance) routing() routingView {
	return routingView{i.State, i.HasLoad, i.LoadValid, i.LoadSource, i.HasLatency}
}

// Snapshot is an immutable view of the registry. It must not be
// modified.
type Snapshot struct {
	// Instances are sorted by name.
	Instances []Instance
	// Version increases with every change.
	Version uint64
	// Synced is true once the first listing of etcd has been applied.
	Synced bool

	next chan struct{} // closed when a newer snapshot replaces this one

	// briefs are Instances' briefs, made with the snapshot; briefsOf is
	// the Instances array they were made for, so a copy of the snapshot
	// given other Instances does not read them (see Briefs).
	briefs   []Brief
	briefsOf *Instance
}

// NewSnapshot returns a snapshot of ins, which must be sorted by name and
// not modified afterwards, with their briefs made.
func NewSnapshot(ins []Instance, version uint64, synced bool) *Snapshot {
	s := &Snapshot{Instances: ins, Version: version, Synced: synced}
	s.makeBriefs()
	return s
}

func (s *Snapshot) makeBriefs() {
	if len(s.Instances) == 0 {
		return
	}
	s.briefs = AppendBriefs(make([]Brief, 0, len(s.Instances)), s.Instances)
	s.briefsOf = &s.Instances[0]
}

// Briefs returns the briefs of s.Instances, in their order, made with
// the snapshot; nil for a snapshot built without them (or a copy given
// other Instances), whose reader makes them with AppendBriefs. The
// slice is the snapshot's: it must not be modified.
func (s *Snapshot) Briefs() []Brief {
	if len(s.Instances) > 0 && len(s.briefs) == len(s.Instances) && s.briefsOf == &s.Instances[0] {
		return s.briefs
	}
	return nil
}

// Brief is what the routing policies read of every instance of a snapshot
// when they look for candidates, packed into 48 bytes: a scan of a fleet
// reads a few contiguous cache lines instead of a line or two of every
// Instance, which a decision finding the caches cold pays a miss for.
type Brief struct {
	WaitingRequests uint64 // Load.WaitingRequests
	MetaGen         uint64 // the Instance's
	// LoadAt is LoadUpdated less the LoadEpoch of the instances the brief
	// was made among, in nanoseconds (by the monotonic clock when both
	// have its reading); NoLoadAt when LoadUpdated is zero.
	LoadAt      int64
	BackendType string // Meta.BackendType
	typ, role   int8
	state       int8
	// HasLoad and LoadValid are the Instance's.
	HasLoad, LoadValid bool
}

// NoLoadAt is Brief.LoadAt of an instance without a load report's time.
const NoLoadAt = math.MinInt64

// LoadEpoch is the origin of the LoadAt of briefs made among ins: the
// LoadUpdated of the first instance that has one, zero when none has.
func LoadEpoch(ins []Instance) time.Time {
	for i := range ins {
		if !ins[i].LoadUpdated.IsZero() {
			return ins[i].LoadUpdated
		}
	}
	return time.Time{}
}

// AppendBriefs appends the briefs of ins to dst.
func AppendBriefs(dst []Brief, ins []Instance) []Brief {
	epoch := LoadEpoch(ins)
	for i := range ins {
		in := &ins[i]
		at := int64(NoLoadAt)
		if !in.LoadUpdated.IsZero() {
			at = int64(in.LoadUpdated.Sub(epoch))
		}
		dst = append(dst, Brief{WaitingRequests: in.Load.WaitingRequests, MetaGen: in.MetaGen, LoadAt: at, BackendType: in.Meta.BackendType,
			typ: small(int(in.Type)), role: small(int(in.Role)), state: small(int(in.State)), HasLoad: in.HasLoad, LoadValid: in.LoadValid})
	}
	return dst
}

// small packs a type or state; every value past int8 becomes -1, which,
// like it, is none of the defined ones.
func small(v int) int8 {
	if v < 0 || v > 127 {
		return -1
	}
	return int8(v)
}

// Type, Role and State are the Instance's (-1 for a value that is none of
// the defined ones and past int8).
func (b *Brief) Type() Type   { return Type(b.typ) }
func (b *Brief) Role() Type   { return Type(b.role) }
func (b *Brief) State() State { return State(b.state) }

// Schedulable is Instance.Schedulable.
func (b *Brief) Schedulable() bool { return State(b.state) != Suspect }

// Lookup returns the instance called name.
func (s *Snapshot) Lookup(name string) (Instance, bool) {
	i, ok := s.Index(name)
	if !ok {
		return Instance{}, false
	}
	return s.Instances[i], true
}

// Index returns the position of the instance called name in s.Instances,
// which are sorted by name, and whether it is there. It reads each
// instance it compares in place, not a copy of it.
func (s *Snapshot) Index(name string) (int, bool) {
	lo, hi := 0, len(s.Instances)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if s.Instances[m].Meta.Name < name {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < len(s.Instances) && s.Instances[lo].Meta.Name == name
}

// WatchState says how current a registry's view of etcd is. While it
// is not Live, the registry keeps serving its last snapshot.
type WatchState struct {
	// Live is true while the view follows etcd: the range was listed and
	// the watch since has neither failed nor been found stalled. A stall
	// is found only WatchStallTimeout after etcd's last answer;
	// LastContact shows the silence before that.
	Live bool
	// LastContact is when etcd last answered the listing or the watch
	// (events or a progress notification); zero before the first
	// listing.
	LastContact time.Time
	// Listings counts the listings of the watched range: the first, and
	// one after every compaction, watch failure or stall.
	Listings uint64
	// Stalls counts watches abandoned because etcd did not answer them
	// within WatchStallTimeout.
	Stalls uint64
}

// Errors of Heartbeat; the HTTP layer answers both with 409 Conflict.
var (
	// ErrUnknownInstance: no instance of that name is registered.
	ErrUnknownInstance = errors.New("unknown instance")
	// ErrStaleIncarnation: the heartbeat's incarnation_id is not the
	// registered one; the sender is an older or newer process.
	ErrStaleIncarnation = errors.New("stale incarnation")
)
