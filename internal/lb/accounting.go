package lb

import (
	"fmt"
	"math/bits"
	"slices"
	"sort"
	"time"
	"unsafe"

	"github.com/zeebo/xxh3"

	"github.com/kvcar/kvcar/internal/instance"
)

// Accounting flag defaults and ranges. The ranges are those the flags
// are validated against at start-up; they bound the memory a burst of
// requests can make the accounting hold.
const (
	DefaultDispatchMaxAge       = 2 * time.Second
	DefaultPendingPrefixTimeout = 10 * time.Second
	DefaultMaxPendingDispatches = 4096
	DefaultMaxPendingBlocks     = 16384
	DefaultAccountingBlockSize  = 128

	MinAccountingAge = time.Millisecond
	MaxAccountingAge = 10 * time.Minute
	MaxHeartbeatLag  = time.Minute
	MaxPendingCap    = 1 << 20
	MaxPendingBlocks = 1 << 22
	MaxAcctBlockSize = 1 << 16
)

// AccountingOptions configure CAR's router-side accounting of what
// kvcar itself dispatched since the engines last told it anything
// (--car_dispatch_accounting, --car_pending_prefixes and their limits).
// The zero value turns both parts off: CAR is then the formula of
// R-CAR-3 alone.
type AccountingOptions struct {
	// Dispatched adds, to each prefill candidate's waiting count, the
	// requests CAR sent it that its latest load report cannot include
	// (see the package doc, "Dispatch accounting").
	Dispatched bool
	// TokenWeight β in [0, 1] blends the uncached prompt tokens of those
	// requests into the queue term.
	TokenWeight float64
	// HeartbeatLag: a load report received less than this after a
	// dispatch does not supersede it. In [0, MaxHeartbeatLag].
	HeartbeatLag time.Duration
	// DispatchMaxAge: a dispatch stops counting after this long even
	// when no load report came. In [MinAccountingAge, MaxAccountingAge].
	DispatchMaxAge time.Duration
	// MaxPendingDispatches bounds the dispatches remembered per
	// instance; past it the oldest is forgotten. In [1, MaxPendingCap].
	MaxPendingDispatches int

	// PendingPrefixes counts the full blocks of prompts CAR sent an
	// instance as expected hits there until the directory reports them
	// or PendingTimeout passes.
	PendingPrefixes bool
	// PendingTimeout in [MinAccountingAge, MaxAccountingAge].
	PendingTimeout time.Duration
	// MaxPendingBlocks bounds the pending blocks remembered per
	// instance; past it the oldest are forgotten. In [1, MaxPendingBlocks].
	MaxPendingBlocks int
	// BlockSize is the engines' KV block size in tokens (the KV events
	// config's block_size), in [1, MaxAcctBlockSize].
	BlockSize int

	// Now is the clock; nil is time.Now. Load reports' LoadUpdated must
	// come from the same clock.
	Now func() time.Time
}

// DefaultAccountingOptions returns the limits' defaults with both parts
// off.
func DefaultAccountingOptions() AccountingOptions {
	return AccountingOptions{
		DispatchMaxAge:       DefaultDispatchMaxAge,
		MaxPendingDispatches: DefaultMaxPendingDispatches,
		PendingTimeout:       DefaultPendingPrefixTimeout,
		MaxPendingBlocks:     DefaultMaxPendingBlocks,
		BlockSize:            DefaultAccountingBlockSize,
	}
}

// Validate checks every field against its range, naming the flag.
func (o AccountingOptions) Validate() error {
	if !(o.TokenWeight >= 0 && o.TokenWeight <= 1) {
		return fmt.Errorf("lb: --car_dispatch_token_weight %v is outside [0, 1]", o.TokenWeight)
	}
	durs := []struct {
		name     string
		v        time.Duration
		min, max time.Duration
	}{
		{"--car_dispatch_heartbeat_lag_ms", o.HeartbeatLag, 0, MaxHeartbeatLag},
		{"--car_dispatch_max_age_ms", o.DispatchMaxAge, MinAccountingAge, MaxAccountingAge},
		{"--car_pending_prefix_timeout_ms", o.PendingTimeout, MinAccountingAge, MaxAccountingAge},
	}
	for _, d := range durs {
		if d.v < d.min || d.v > d.max {
			return fmt.Errorf("lb: %s = %d: must be in [%d, %d]", d.name, d.v.Milliseconds(), d.min.Milliseconds(), d.max.Milliseconds())
		}
	}
	ints := []struct {
		name     string
		v        int
		min, max int
	}{
		{"--car_max_pending_dispatches", o.MaxPendingDispatches, 1, MaxPendingCap},
		{"--car_max_pending_blocks", o.MaxPendingBlocks, 1, MaxPendingBlocks},
		{"block_size (pending prefixes)", o.BlockSize, 1, MaxAcctBlockSize},
	}
	for _, d := range ints {
		if d.v < d.min || d.v > d.max {
			return fmt.Errorf("lb: %s = %d: must be in [%d, %d]", d.name, d.v, d.min, d.max)
		}
	}
	return nil
}

func (o AccountingOptions) enabled() bool { return o.Dispatched || o.PendingPrefixes }

// accounting is CAR's memory of its own recent decisions. Everything in
// it is guarded by CAR.acctMu, held from reading the dispatches to
// recording the decision's own, so that the requests of a burst see each
// other; the directory query before it needs no accounting state.
type accounting struct {
	opts AccountingOptions
	now  func() time.Time
	// base is the origin of the int64 times below, taken from the same
	// clock as the load reports' LoadUpdated, so differences use the
	// monotonic reading.
	base time.Time
	// insts holds the instances CAR dispatched to, by name; pruned to the
	// snapshot's instances whenever the snapshot changes.
	insts map[string]*instAcct
	// at holds the same states by position in seenSnap.Instances (nil
	// where there is none), so a decision finds a candidate's state from
	// its index: a lookup by name read the candidate's Instance, its name
	// and the map's groups, each a cache miss in a sparse decision.
	at []*instAcct
	// sums mirror, by the same positions, the first fields of each state
	// (zero where there is none): a decision whose candidates need no
	// ring reads one contiguous array instead of a line of every state.
	sums []acctSum
	// tickets numbers decisions, for Release.
	tickets  uint64
	seenSnap *instance.Snapshot
	// seenGens are seenSnap's MetaGens, nil unless it had its briefs and
	// every one was known (see gensOf).
	seenGens []uint64
	// loadEpoch is seenSnap's instance.LoadEpoch since base: a brief's
	// LoadAt plus it is its load report's time, read without the
	// Instance.
	loadEpoch int64
}

// acctSum is what a decision reads of an instance's accounting: its
// state's times and live tokens, and how many dispatches its ring holds.
type acctSum struct {
	acctTimes
	n int
}

type acctTimes struct {
	// oldest and newest are the times of the ring's oldest and newest
	// dispatch, valid while it holds any: a decision reads the ring only
	// when a dispatch has expired, or some are older than the load report
	// and some newer.
	oldest, newest int64
	// liveTokens sums the tokens of the live records.
	liveTokens float64
}

// instAcct is one instance's accounting.
type instAcct struct {
	acctTimes
	// place is the state's position in accounting.at, -1 once forgotten.
	place int
	// dispatches is a ring in dispatch order (times and tickets only
	// grow).
	dispatches ring[dispatchRec]
	// name and registered tell the instance's incarnation apart from a
	// later one under the same name.
	name       string
	registered time.Time
	// pending maps a block's chain key to when it stops counting; order
	// is the ring of insertions that bounds it.
	pending map[uint64]int64
	order   ring[pendingRec]
}

type dispatchRec struct {
	at     int64 // ns since base
	tokens float64
	ticket uint64
	// live is true until the request is released (it ended) or its
	// record leaves the ring.
	live bool
}

type pendingRec struct {
	key     uint64
	expires int64
}

// ring is a FIFO of at most cap entries: its buffer grows by doubling
// up to cap, then a push overwrites the oldest entry.
type ring[T any] struct {
	buf        []T // len(buf) is the allocated size
	head, size int
	cap        int
}

func (r *ring[T]) push(v T) (evicted T, full bool) {
	if r.size == r.cap {
		evicted = r.buf[r.head]
		r.buf[r.head] = v
		r.head = (r.head + 1) % len(r.buf)
		return evicted, true
	}
	if r.size == len(r.buf) {
		nb := make([]T, min(max(2*len(r.buf), 16), r.cap))
		for i := range r.size {
			nb[i] = r.buf[(r.head+i)%len(r.buf)]
		}
		r.buf, r.head = nb, 0
	}
	r.buf[(r.head+r.size)%len(r.buf)] = v
	r.size++
	return evicted, false
}

func (r *ring[T]) front() *T { return &r.buf[r.head] }

func (r *ring[T]) pop() {
	var zero T
	r.buf[r.head] = zero
	r.head = (r.head + 1) % len(r.buf)
	r.size--
}

// at returns the i-th oldest entry.
func (r *ring[T]) at(i int) *T { return &r.buf[(r.head+i)%len(r.buf)] }

// search returns the index of the oldest entry for which after holds, or
// size if none does; after must be false up to some entry and true from
// it on, as for sort.Search.
func (r *ring[T]) search(after func(*T) bool) int {
	return sort.Search(r.size, func(i int) bool { return after(r.at(i)) })
}

func newAccounting(o AccountingOptions) *accounting {
	now := o.Now
	if now == nil {
		now = time.Now
	}
	return &accounting{opts: o, now: now, base: now(), insts: make(map[string]*instAcct)}
}

func (a *accounting) since(t time.Time) int64 { return int64(t.Sub(a.base)) }

// sync forgets the instances that left the snapshot, became SUSPECT or
// were replaced by another incarnation, so nothing is counted for them
// again (and never over a new process's empty cache), and places the
// others' states at their positions in snap.
func (a *accounting) sync(snap *instance.Snapshot) {
	if snap == nil {
		return
	}
	// Places hold for one snapshot: another, even of the same version,
	// is checked, cheaply when its MetaGens are the same.
	if snap == a.seenSnap {
		return
	}
	same := sameGens(a.seenGens, snap)
	a.seenSnap = snap
	a.loadEpoch = a.since(instance.LoadEpoch(snap.Instances))
	if same {
		// The same registrations in the same places (a new MetaGen comes
		// with every one), so every instance tracked is still there, at
		// its position and of the same incarnation: only its state may
		// have changed, and the briefs say it.
		for i, b := range snap.Briefs() {
			if st := a.at[i]; st != nil && !b.Schedulable() {
				a.forget(st)
			}
		}
		return
	}
	a.seenGens = gensOf(snap)
	n := len(snap.Instances)
	a.at = slices.Grow(a.at[:0], n)[:n]
	clear(a.at)
	a.sums = slices.Grow(a.sums[:0], n)[:n]
	clear(a.sums)
	for name, st := range a.insts {
		i, ok := snap.Index(name)
		if !ok || !snap.Instances[i].Schedulable() || !snap.Instances[i].Registered.Equal(st.registered) {
			delete(a.insts, name)
			st.place = -1
			continue
		}
		a.at[i], st.place = st, i
		a.sums[i] = st.sum()
	}
}

// forget drops st, which is at its place.
func (a *accounting) forget(st *instAcct) {
	delete(a.insts, st.name)
	a.at[st.place], a.sums[st.place] = nil, acctSum{}
	st.place = -1
}

// mirror copies st's sum to its place, after every change of it.
func (a *accounting) mirror(st *instAcct) {
	if st.place >= 0 {
		a.sums[st.place] = st.sum()
	}
}

func (st *instAcct) sum() acctSum { return acctSum{st.acctTimes, st.dispatches.size} }

// stateOrNew returns the state of in, at position i of the snapshot
// last synced, making it if there is none.
func (a *accounting) stateOrNew(i int, in *instance.Instance) *instAcct {
	if st := a.at[i]; st != nil {
		return st
	}
	st := &instAcct{name: in.Meta.Name, registered: in.Registered, place: i}
	st.dispatches.cap = a.opts.MaxPendingDispatches
	st.order.cap = a.opts.MaxPendingBlocks
	a.insts[st.name] = st
	a.at[i], a.sums[i] = st, acctSum{}
	return st
}

// outstanding returns, for the instance at place i, whose latest load
// report came at loaded (since base; noLoad for none), the requests CAR
// sent it that the report cannot include (dispatched after loaded −
// HeartbeatLag), and the uncached prompt tokens of the requests sent it
// that have not ended (been released); both only of dispatches less
// than DispatchMaxAge old, older records are dropped. A load report
// carries no tokens, so it supersedes only the count.
func (a *accounting) outstanding(i int, loaded, now int64) (reqs, toks float64) {
	sum := &a.sums[i]
	old := now - int64(a.opts.DispatchMaxAge)
	if sum.n > 0 && sum.oldest <= old {
		st := a.at[i]
		st.expire(old)
		a.mirror(st)
	}
	if sum.n == 0 {
		return 0, 0
	}
	cut := old
	if loaded != noLoad {
		cut = max(cut, loaded-int64(a.opts.HeartbeatLag))
	}
	toks = sum.liveTokens
	if toks < 0.5 { // float drift of an empty sum
		toks = 0
	}
	// The count is all or nothing unless the cut falls among the
	// dispatches; only then is the ring read.
	switch {
	case sum.newest <= cut:
		return 0, toks
	case sum.oldest > cut:
		return float64(sum.n), toks
	}
	return float64(a.at[i].after(cut)), toks
}

// noLoad is a load report time that is none.
const noLoad = instance.NoLoadAt

// loadedAt is the time since base of the load report of the instance
// whose brief is b, so a decision reads no Instance for it.
func (a *accounting) loadedAt(b *instance.Brief) int64 {
	if b.LoadAt == instance.NoLoadAt {
		return noLoad
	}
	return b.LoadAt + a.loadEpoch
}

// expire drops the dispatches made at or before old.
func (st *instAcct) expire(old int64) {
	d := &st.dispatches
	for d.size > 0 && d.front().at <= old {
		st.drop(*d.front())
		d.pop()
	}
	if d.size == 0 {
		st.liveTokens = 0 // a sum of nothing, whatever the float drift
		return
	}
	st.oldest = d.front().at
}

// after counts the dispatches made after cut, which falls among them:
// oldest ≤ cut < newest. Times only grow along the ring, so they are a
// suffix; it is found from the newest end by doubling steps, then
// halving, so a decision's cost grows with the logarithm of the count
// and reads the ring only near its end, not with how many dispatches a
// burst left in it.
func (st *instAcct) after(cut int64) int {
	d := &st.dispatches
	// at(lo) ≤ cut < at(hi).
	lo, hi := 0, d.size-1
	for step := 1; hi-step > 0; step *= 2 {
		if d.at(hi-step).at <= cut {
			lo = hi - step
			break
		}
		hi -= step
	}
	for hi-lo > 1 {
		m := int(uint(lo+hi) >> 1)
		if d.at(m).at <= cut {
			lo = m
		} else {
			hi = m
		}
	}
	return d.size - hi
}

// drop takes a record leaving the ring out of the live sum.
func (st *instAcct) drop(r dispatchRec) {
	if r.live {
		st.liveTokens -= r.tokens
	}
}

func (a *accounting) recordDispatch(st *instAcct, now int64, uncached float64, ticket uint64) {
	if old, full := st.dispatches.push(dispatchRec{at: now, tokens: uncached, ticket: ticket, live: true}); full {
		st.drop(old)
	}
	st.oldest, st.newest = st.dispatches.front().at, now
	st.liveTokens += uncached
	a.mirror(st)
}

// release marks the request of ticket, routed to instance name, ended:
// its tokens stop counting. An unknown ticket (forgotten, or of an
// instance that left) is ignored.
func (a *accounting) release(name string, ticket uint64) {
	st := a.insts[name]
	if st == nil {
		return
	}
	d := &st.dispatches
	lo := d.search(func(r *dispatchRec) bool { return r.ticket >= ticket })
	if lo < d.size {
		if r := d.at(lo); r.ticket == ticket && r.live {
			r.live = false
			st.liveTokens -= r.tokens
			a.mirror(st)
		}
	}
}

// pendingBlocks is the number of leading blocks of keys pending on the
// instance whose state is st (nil if none).
func (st *instAcct) pendingBlocks(keys []uint64, now int64) int {
	if st == nil || len(st.pending) == 0 {
		return 0
	}
	n := 0
	for _, k := range keys {
		if exp, ok := st.pending[k]; !ok || exp <= now {
			break
		}
		n++
	}
	return n
}

// confirm forgets the pending blocks keys: the engine's events have
// reported them, so the directory answers for them from now on,
// including when the engine later evicts them.
func (st *instAcct) confirm(keys []uint64) {
	for _, k := range keys {
		delete(st.pending, k)
	}
}

// addPending remembers keys as pending until now+PendingTimeout,
// shallowest first; a prompt longer than MaxPendingBlocks blocks keeps
// its first MaxPendingBlocks, the ones a later prompt can share.
func (st *instAcct) addPending(keys []uint64, now int64, timeout time.Duration) {
	if st.pending == nil {
		st.pending = make(map[uint64]int64)
	}
	exp := now + int64(timeout)
	// Drop what expired, so the map holds live entries only.
	for st.order.size > 0 && st.order.front().expires <= now {
		st.forget(*st.order.front())
		st.order.pop()
	}
	keys = keys[:min(len(keys), st.order.cap)]
	for _, k := range keys {
		st.pending[k] = exp
		if old, full := st.order.push(pendingRec{key: k, expires: exp}); full {
			st.forget(old)
		}
	}
}

// forget deletes r's key unless a later insertion renewed it.
func (st *instAcct) forget(r pendingRec) {
	if exp, ok := st.pending[r.key]; ok && exp == r.expires {
		delete(st.pending, r.key)
	}
}

// chainKeys appends to dst one key per full block of ids: a hash of the
// block's tokens and the key of the block before it, so equal keys mean
// equal prefixes (up to 64-bit collisions, which can only mislead a
// routing preference, never a reported hit). A block is hashed whole
// (XXH3 over its ids' memory, which differs between byte orders but not
// within a process, the keys' only scope), and only the mix with the
// parent is a chain: a token-by-token chain took as long as the rest of
// the decision.
func chainKeys(ids []uint32, blockSize int, dst []uint64) []uint64 {
	parent := uint64(0x9e3779b97f4a7c15)
	for b := 0; b+blockSize <= len(ids); b += blockSize {
		blk := ids[b : b+blockSize]
		h := xxh3.Hash(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(blk))), 4*len(blk)))
		h ^= bits.RotateLeft64(parent*0xff51afd7ed558ccd, 31)
		// Finalise so that neighbouring blocks spread.
		h ^= h >> 33
		h *= 0xc4ceb9fe1a85ec53
		h ^= h >> 33
		dst = append(dst, h)
		parent = h
	}
	return dst
}

// queueCosts is queueCosts (R-CAR-3) with the requests CAR dispatched
// since each candidate's load report (read from bs, the briefs the
// candidates came from) added to its waiting count, and, with
// TokenWeight β > 0, blended with their uncached prompt tokens:
//
//	queue = (1−β)·(waiting + sent) / max(waiting + sent) + β·tokens / max(tokens)
//
// each ratio 0 when its maximum is 0, and the request term alone while
// no candidate has tokens outstanding.
func (a *accounting) queueCosts(cands []candidate, bs []instance.Brief, now int64) {
	if !a.opts.Dispatched {
		queueCosts(cands)
		return
	}
	var maxQ, maxT float64
	for i := range cands {
		c := &cands[i]
		r, t := a.outstanding(c.idx, a.loadedAt(&bs[c.idx]), now)
		c.score, c.tie = float64(c.waiting)+r, t
		maxQ, maxT = max(maxQ, c.score), max(maxT, t)
	}
	beta := a.opts.TokenWeight
	if maxT == 0 {
		beta = 0
	}
	for i := range cands {
		c := &cands[i]
		q := 0.0
		if maxQ > 0 {
			q = c.score / maxQ
		}
		if beta > 0 {
			q = (1-beta)*q + beta*c.tie/maxT
		}
		c.score, c.tie = q, 0
	}
}

// pendingHits raises each prefill candidate's hit ratio to the share of
// the prompt's leading full blocks pending on it, when that is more than
// the directory reports; when the directory already reports as much,
// the engine's events have confirmed those blocks and they stop being
// pending. It never changes what the directory reports. The caller
// holds acctMu; pendingKeys has put the prompt's block keys in s.keys.
func (a *accounting) pendingHits(s *scratch, inputTokens int, now int64) {
	input := float64(inputTokens)
	for i := range s.p {
		p := &s.p[i]
		st := a.at[p.idx]
		n := st.pendingBlocks(s.keys, now)
		if n == 0 {
			continue
		}
		ph := clamp01(float64(n*a.opts.BlockSize) / input)
		if p.known >= ph {
			st.confirm(s.keys[:n])
			continue
		}
		p.hit = max(p.hit, ph)
	}
}

// pendingKeys puts the block keys of the prompt's leading full blocks in
// s.keys, for pendingHits and record, and reports whether there are any
// to look up. Without a view nothing is pending: with the index off
// every hit is 0 (R-CFG-1).
func (c *CAR) pendingKeys(tokenIDs []uint32, s *scratch) bool {
	s.keys = s.keys[:0]
	if c.view.Load() == nil || len(tokenIDs) < c.acct.opts.BlockSize {
		return false
	}
	s.keys = chainKeys(tokenIDs, c.acct.opts.BlockSize, s.keys)
	return true
}

// record remembers the decision for p: one dispatched request with its
// uncached prompt tokens (by the hit ratio it was chosen with), and the
// prompt's blocks past those the directory reports there as pending on
// it.
func (a *accounting) record(p *candidate, input int, keys []uint64, now int64, ticket uint64) {
	if a.opts.Dispatched {
		a.recordDispatch(a.stateOrNew(p.idx, p.inst), now, float64(input)*(1-p.hit), ticket)
	}
	if a.opts.PendingPrefixes && len(keys) > 0 {
		// The blocks the directory already reports there need no
		// pending entry.
		known := min(int(p.known*float64(input))/a.opts.BlockSize, len(keys))
		if keys = keys[known:]; len(keys) > 0 {
			a.stateOrNew(p.idx, p.inst).addPending(keys, now, a.opts.PendingTimeout)
		}
	}
}
