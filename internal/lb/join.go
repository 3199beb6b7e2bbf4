package lb

import (
	"sync/atomic"
	"unsafe"

	"github.com/kvcar/kvcar/internal/instance"
	"github.com/kvcar/kvcar/internal/kvdir"
)

// carJoin ties a registry snapshot's instances to the directory
// layout's streams: for each instance, the streams whose hits decide its
// hit ratio. Finding them compares every instance's name and identity
// with the streams', strings that live apart from the structures holding
// them, so a decision that finds the caches cold would pay a cache miss
// for each; the join changes only when an instance or stream comes, goes
// or changes identity, so CAR keeps it between decisions and checks it
// against a new snapshot by the identity of those strings, not their
// bytes; or, where the registry names its Metas (Instance.MetaGen), by
// those names alone, read from the briefs a decision reads anyway, so
// that the snapshot a load report brings costs no scan of the instances.
type carJoin struct {
	layout *kvdir.Layout
	// snap is the snapshot the join was last found valid for; ids what
	// the spans depend on of each of its instances, and gens their
	// MetaGens, nil unless every one is known (non-zero). A snapshot with
	// the same MetaGens replaces snap in place: the join is the same.
	snap  atomic.Pointer[instance.Snapshot]
	ids   []memberID
	gens  []uint64
	spans []span
}

// memberID is what the join reads of an instance.
type memberID struct {
	name, incarnationID string
	registerTsMs        int64
	dpSize              int
}

// span is the layout's streams [lo, hi) whose hits decide an instance's
// ratio: its DP ranks' streams, subscribed for its current process. An
// empty span means none can (a rank missing, a stream of another
// process): the ratio is 0 whatever the streams hold (R-CAR-6, R-CAR-7).
type span struct{ lo, hi int32 }

func memberOf(in *instance.Instance) memberID {
	return memberID{in.Meta.Name, in.Meta.IncarnationID, in.Meta.RegisterTsMs, in.Meta.DPSize}
}

// same reports whether a and b are the same strings and values. Strings
// are compared by their bytes' address and length, which reads neither:
// equal addresses and lengths mean equal contents, and the join keeps
// its strings alive, so their memory is not reused meanwhile. Equal
// contents at different addresses compare unequal and only cost a
// rebuild.
func (a *memberID) same(b *memberID) bool {
	return a.registerTsMs == b.registerTsMs && a.dpSize == b.dpSize &&
		sameString(a.name, b.name) && sameString(a.incarnationID, b.incarnationID)
}

func sameString(a, b string) bool {
	return len(a) == len(b) && (len(a) == 0 || unsafe.StringData(a) == unsafe.StringData(b))
}

// joinFor returns the join of snap and layout: the kept one when it was
// made for both, or for layout and a snapshot whose instances have the
// same identities (recorded for snap, so that the next decisions on snap
// check nothing); otherwise a new one.
func (c *CAR) joinFor(snap *instance.Snapshot, layout *kvdir.Layout) *carJoin {
	j := c.join.Load()
	if j != nil && j.layout == layout {
		if j.snap.Load() == snap {
			return j
		}
		if j.sameGens(snap) {
			j.snap.Store(snap)
			return j
		}
		if j.validFor(snap) {
			j = &carJoin{layout: layout, ids: j.ids, gens: gensOf(snap), spans: j.spans}
			j.snap.Store(snap)
			c.join.Store(j)
			return j
		}
	}
	j = buildJoin(snap, layout)
	c.join.Store(j)
	return j
}

// sameGens reports whether every instance of snap has the MetaGen the
// join recorded, in the same place: then each has the Meta the spans
// were found with.
func (j *carJoin) sameGens(snap *instance.Snapshot) bool { return sameGens(j.gens, snap) }

// sameGens reports whether snap's instances have MetaGens gens, in that
// order; never when gens is nil (unknown).
func sameGens(gens []uint64, snap *instance.Snapshot) bool {
	bs := snap.Briefs()
	if gens == nil || len(bs) != len(gens) {
		return false
	}
	for i := range bs {
		if bs[i].MetaGen != gens[i] {
			return false
		}
	}
	return true
}

// gensOf returns the MetaGens of snap's instances, nil unless the
// snapshot has its briefs and every one is known.
func gensOf(snap *instance.Snapshot) []uint64 {
	bs := snap.Briefs()
	if bs == nil {
		return nil
	}
	gens := make([]uint64, len(bs))
	for i := range bs {
		if gens[i] = bs[i].MetaGen; gens[i] == 0 {
			return nil
		}
	}
	return gens
}

func (j *carJoin) validFor(snap *instance.Snapshot) bool {
	if len(j.ids) != len(snap.Instances) {
		return false
	}
	for i := range snap.Instances {
		id := memberOf(&snap.Instances[i])
		if !id.same(&j.ids[i]) {
			return false
		}
	}
	return true
}

// buildJoin walks the snapshot's instances and the layout's streams
// together, both sorted by instance name.
func buildJoin(snap *instance.Snapshot, layout *kvdir.Layout) *carJoin {
	j := &carJoin{layout: layout, ids: make([]memberID, len(snap.Instances)), gens: gensOf(snap),
		spans: make([]span, len(snap.Instances))}
	j.snap.Store(snap)
	ss := layout.Streams
	k := 0
	for i := range snap.Instances {
		in := &snap.Instances[i]
		j.ids[i] = memberOf(in)
		name := in.Name()
		for k < len(ss) && ss[k].InstanceName < name {
			k++
		}
		end := k
		for end < len(ss) && ss[end].InstanceName == name {
			end++
		}
		j.spans[i] = spanOf(in, ss, k, end)
		k = end
	}
	return j
}

// spanOf returns the span of in among its streams ss[from:to], sorted by
// DP rank: the streams of its DP ranks, which must each have one, all
// subscribed for its current process; a stream of a rank the instance
// no longer has does not count.
func spanOf(in *instance.Instance, ss []kvdir.StreamInfo, from, to int) span {
	dpSize := max(in.Meta.DPSize, 1)
	lo, hi := -1, -1
	ranks, last := 0, -1
	for k := from; k < to; k++ {
		s := &ss[k]
		if s.DPRank < 0 || s.DPRank >= dpSize {
			continue // a stream of a DP topology the instance no longer has
		}
		if !sameIncarnation(in, s.Incarnation, s.Discovered) {
			return span{}
		}
		if lo < 0 {
			lo = k
		}
		hi = k + 1
		if s.DPRank != last {
			ranks++
			last = s.DPRank
		}
	}
	if ranks != dpSize {
		return span{}
	}
	return span{int32(lo), int32(hi)}
}
