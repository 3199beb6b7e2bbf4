package lb

import (
	"cmp"
	"errors"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvcar/kvcar/internal/instance"
	"github.com/kvcar/kvcar/internal/kvdir"
)

// The instances, snapshots and matches of these tests are plain values,
// built the way the registry and the directory build them.

// loaded is an ACTIVE instance of type t with a valid load report and
// incarnation "inc-<name>".
func loaded(name string, t instance.Type, waiting uint64, gpu float64) instance.Instance {
	return instance.Instance{
		Meta: instance.Meta{
			Name:          name,
			IncarnationID: "inc-" + name,
			Type:          t,
			DPSize:        1,
			BackendType:   "xllm",
		},
		Type:      t,
		Role:      t,
		State:     instance.Active,
		HasLoad:   true,
		LoadValid: true,
		Load:      instance.Load{WaitingRequests: waiting, GPUCacheUsagePerc: gpu},
	}
}

// mix is a MIX instance playing role.
func mix(name string, role instance.Type, waiting uint64, gpu float64) instance.Instance {
	in := loaded(name, instance.Mix, waiting, gpu)
	in.Role = role
	return in
}

func withDP(in instance.Instance, dp int) instance.Instance {
	in.Meta.DPSize = dp
	return in
}

func withState(in instance.Instance, s instance.State) instance.Instance {
	in.State = s
	return in
}

func withBackend(in instance.Instance, b string) instance.Instance {
	in.Meta.BackendType = b
	return in
}

// snapshot returns a registry snapshot of ins, sorted by name as the
// registry sorts it.
func snapshot(ins ...instance.Instance) *instance.Snapshot {
	ins = slices.Clone(ins)
	slices.SortFunc(ins, func(a, b instance.Instance) int { return strings.Compare(a.Meta.Name, b.Meta.Name) })
	return instance.NewSnapshot(ins, 1, true)
}

// match is a synchronised stream's answer for instance name, subscribed
// for the incarnation loaded gives it.
func match(name string, dp, device, hostOnly int) kvdir.Match {
	return kvdir.Match{
		InstanceName:         name,
		DPRank:               dp,
		Incarnation:          "inc-" + name,
		Synchronized:         true,
		DeviceHitTokens:      device,
		HostOnlyHitTokens:    hostOnly,
		ReusablePrefixTokens: device + hostOnly,
	}
}

// matches is a directory's answer: a fixed list of matches, in the
// directory's order (instance, then DP), answered as a directory's Hits
// answers them: the streams' layout, made once as the directory makes
// one per stream set, and their hits, a stream that is not synchronised
// reporting none. It counts its queries.
type matches struct {
	list    []kvdir.Match
	layout  *kvdir.Layout
	queries atomic.Int64
	lastLen atomic.Int64
}

func newMatches(ms ...kvdir.Match) *matches {
	ms = slices.Clone(ms)
	slices.SortFunc(ms, func(a, b kvdir.Match) int {
		return cmp.Or(strings.Compare(a.InstanceName, b.InstanceName), cmp.Compare(a.DPRank, b.DPRank))
	})
	l := &kvdir.Layout{}
	for _, m := range ms {
		l.Streams = append(l.Streams, kvdir.StreamInfo{InstanceName: m.InstanceName, DPRank: m.DPRank, Incarnation: m.Incarnation, Discovered: m.Discovered})
	}
	return &matches{list: ms, layout: l}
}

func (m *matches) Hits(tokenIDs []uint32, dst []kvdir.Hit) (*kvdir.Layout, []kvdir.Hit) {
	m.queries.Add(1)
	m.lastLen.Store(int64(len(tokenIDs)))
	for i := range m.list {
		ms := &m.list[i]
		if !ms.Synchronized {
			dst = append(dst, kvdir.Hit{})
			continue
		}
		dst = append(dst, kvdir.Hit{DeviceTokens: ms.DeviceHitTokens, HostOnlyTokens: ms.HostOnlyHitTokens, OK: true})
	}
	return m.layout, dst
}

func tokens(n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(i + 1)
	}
	return t
}

func mustCAR(t testing.TB, lambda, w float64, view PrefixView) *CAR {
	t.Helper()
	c, err := NewCAR(lambda, w)
	if err != nil {
		t.Fatal(err)
	}
	c.SetPrefixView(view)
	return c
}

func route(t testing.TB, p Policy, req Request, snap *instance.Snapshot) Decision {
	t.Helper()
	d, err := p.Route(req, snap)
	if err != nil {
		t.Fatalf("%s: Route: %v", p.Name(), err)
	}
	if d.Policy != p.Name() {
		t.Fatalf("Decision.Policy = %q, want %q", d.Policy, p.Name())
	}
	return d
}

func wantRoute(t testing.TB, d Decision, prefill, decode string) {
	t.Helper()
	if d.Prefill != prefill || d.Decode != decode {
		t.Fatalf("routed to (%q, %q), want (%q, %q); decision %+v", d.Prefill, d.Decode, prefill, decode, d)
	}
}

func wantFloat(t testing.TB, what string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > 1e-9*math.Max(1, math.Abs(want)) {
		t.Fatalf("%s = %.12g, want %.12g", what, got, want)
	}
}

func wantNoCandidate(t testing.TB, err error, mentions ...string) {
	t.Helper()
	if !errors.Is(err, ErrNoCandidate) {
		t.Fatalf("err = %v, want ErrNoCandidate", err)
	}
	for _, m := range mentions {
		if !strings.Contains(err.Error(), m) {
			t.Fatalf("err %q does not mention %q", err, m)
		}
	}
}

// ttftProfile is ttft_profiling_data: [input_len, ms] pairs.
func ttftProfile(points ...[2]float64) []instance.TTFTPoint {
	out := make([]instance.TTFTPoint, len(points))
	for i, p := range points {
		out[i] = instance.TTFTPoint{InputLen: int(p[0]), TTFTMs: p[1]}
	}
	return out
}

// tpotProfile is tpot_profiling_data: [avg_len, batch_size, ms] triples.
func tpotProfile(points ...[3]float64) []instance.TPOTPoint {
	out := make([]instance.TPOTPoint, len(points))
	for i, p := range points {
		out[i] = instance.TPOTPoint{AvgLen: int(p[0]), BatchSize: int(p[1]), TPOTMs: p[2]}
	}
	return out
}
