package kvdir

// Layout is the directory's streams as a router joins them with its
// registry snapshot: sorted by instance then DP rank, as Query answers.
// A Layout is immutable and stays the same value while the streams do,
// so a router may keep what it derived from one until Hits returns
// another.
type Layout struct {
	Streams []StreamInfo
}

// StreamInfo is what a router needs to know of a stream to trust its
// hits: whose engine process it follows (R-CAR-6, R-CAR-7).
type StreamInfo struct {
	InstanceName string
	DPRank       int
	// Incarnation and Discovered are as in Match.
	Incarnation string
	Discovered  bool
}

// info returns the identity of the spec's stream as queries report it.
func (sp *StreamSpec) info() StreamInfo {
	return StreamInfo{InstanceName: sp.InstanceName, DPRank: sp.DPRank, Incarnation: sp.Incarnation, Discovered: sp.Discovered}
}

// Hit is one stream's answer to a router's prefix query (Directory.Hits).
type Hit struct {
	// DeviceTokens and HostOnlyTokens are as Match's DeviceHitTokens and
	// HostOnlyHitTokens.
	DeviceTokens, HostOnlyTokens int
	// OK is true when the stream's slot was published at the moment its
	// key group was walked: the hits are those of a whole view, which the
	// stream serves or is about to (it says synchronised just after).
	// A stream without a view reports no hits (R-REC-1).
	OK bool
}

// hitsAttempts bounds how often Hits walks again because the stream set
// changed under it.
const hitsAttempts = 3

// Hits is Query for a router: it appends one Hit per stream of the
// returned Layout, in the Layout's order, reading only the walks' dense
// per-slot results, never the streams themselves or their names, so a
// decision that finds the caches cold pays for the prompt's blocks and
// not for 128 scattered stream structures. It does not allocate when dst
// has room.
//
// A slot names a stream only while the stream's set is served: a slot
// freed by a retired stream may be reused by the next set's new one.
// Hits therefore answers only for a set that was still served after the
// walk (so no stream of it had been retired when its slot was read);
// after hitsAttempts changes in a row it reports no hits at all.
func (d *Directory) Hits(tokenIDs []uint32, dst []Hit) (*Layout, []Hit) {
	set := d.set.Load()
	for range hitsAttempts {
		qs := d.walkAll(set, tokenIDs)
		if now := d.set.Load(); now != set {
			d.putScratch(qs)
			set = now
			continue
		}
		for si, slot := range set.slotOf {
			var h Hit
			if qs != nil {
				g := set.groupOf[si]
				if dev, hostOnly, ok := qs.walks[g].tokensOf(int(slot)); ok {
					h = Hit{DeviceTokens: dev, HostOnlyTokens: hostOnly, OK: true}
				}
			}
			dst = append(dst, h)
		}
		d.putScratch(qs)
		return set.layout, dst
	}
	for range set.slotOf {
		dst = append(dst, Hit{})
	}
	return set.layout, dst
}

// walkAll walks tokenIDs over every key group of set; nil when there is
// nothing to walk. The caller returns the scratch with putScratch.
func (d *Directory) walkAll(set *streamSet, tokenIDs []uint32) *queryScratch {
	if len(tokenIDs) == 0 || len(set.groups) == 0 {
		return nil
	}
	qs := d.scratch.Get().(*queryScratch)
	for len(qs.walks) < len(set.groups) {
		qs.walks = append(qs.walks, walkResult{})
	}
	for i, t := range set.tables {
		qs.walks[i].walked = false
		if len(tokenIDs) >= t.blockSize {
			t.walk(tokenIDs, &qs.walks[i])
		}
	}
	return qs
}

func (d *Directory) putScratch(qs *queryScratch) {
	if qs != nil {
		d.scratch.Put(qs)
	}
}

// index fills the set's slots and layout from its streams and groupOf;
// every stream must be attached.
func (s *streamSet) index() *streamSet {
	s.slotOf = make([]int32, len(s.streams))
	s.layout = &Layout{Streams: make([]StreamInfo, len(s.streams))}
	for i, st := range s.streams {
		s.slotOf[i] = int32(st.slot)
		s.layout.Streams[i] = st.spec.info()
	}
	return s
}
