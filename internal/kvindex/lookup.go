package kvindex

// KeyLookup finds an index's keyed entries on a tier by content key. The
// index keeps no such table as it changes: every stored block would pay
// an insert and every evicted ghost a delete, for lookups only tests and
// benchmarks make (queries walk the directory's shared key table). A
// lookup is built from the index as
// it stands, costs four bytes a cell (a cell and a half an entry), and is
// valid until the index next changes; using it after that panics. The
// zero value is empty and ready to Build.
type KeyLookup struct {
	ix  *Index
	gen uint64
	t   table
}

// Build makes l a lookup of ix's keyed entries on some tier, reusing l's
// cells when they are enough. Ghosts and orphans are left out: they are
// hits on no tier.
func (l *KeyLookup) Build(ix *Index) {
	n := 0
	for _, m := range ix.meta {
		if keyedOnTier(m) {
			n++
		}
	}
	l.ix, l.gen = ix, ix.gen
	cells := l.t.cells
	l.t = newTable(ix.cfg.MaxBlocks)
	// Reused cells may be more than n entries need, not many more: a
	// lookup built for a large index and then a small one would walk the
	// large one's cells to clear them.
	if size := tableSize(n, ix.cfg.MaxBlocks); len(cells) >= size && len(cells) <= 2*size {
		l.t.cells = cells
		l.t.reset()
	} else {
		l.t.alloc(size)
	}
	for s, m := range ix.meta {
		if !keyedOnTier(m) {
			continue
		}
		home, tag := l.t.keyHash(ix.entries[s].key)
		l.t.place(home, l.t.cell(tag, uint32(s)))
	}
}

// tiers returns the union of the tiers of the entries holding k, or just
// Device as soon as one of them is on Device when deviceEnough is set.
func (l *KeyLookup) tiers(k Key, deviceEnough bool) uint8 {
	if l.ix == nil {
		return 0
	}
	if l.gen != l.ix.gen {
		panic("kvindex: KeyLookup used after its index changed")
	}
	t := &l.t
	var tiers uint8
	i, tag := t.keyHash(k)
	cells, sb, n := t.cells, t.sb, uint64(len(t.cells))
	for ; ; i++ {
		if i == n {
			i = 0
		}
		c := cells[i]
		if c == 0 {
			return tiers
		}
		if c>>sb != tag {
			continue
		}
		if s := c&(1<<sb-1) - 1; l.ix.entries[s].key == k {
			tiers |= l.ix.meta[s] & (tierDevice | tierHost)
			if deviceEnough && tiers&tierDevice != 0 {
				return tiers
			}
		}
	}
}

// Tiers reports whether some entry holding content key k is on Device and
// whether some entry holding it is on Host.
func (l *KeyLookup) Tiers(k Key) (onDevice, onHost bool) {
	t := l.tiers(k, false)
	return t&tierDevice != 0, t&tierHost != 0
}

// Match walks keys in order and returns the contiguous prefix held on
// either tier, stopping at the first key on neither (R-IDX-3). A block on
// both tiers counts as Device.
func (l *KeyLookup) Match(keys []Key) Match {
	var m Match
	for _, k := range keys {
		t := l.tiers(k, true)
		switch {
		case t&tierDevice != 0:
			m.DeviceBlocks++
		case t&tierHost != 0:
			m.HostOnlyBlocks++
		default:
			return m
		}
	}
	return m
}
