package lb

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/kvcar/kvcar/internal/instance"
)

// CAR is cache-aware routing (R-CAR-3..8): the prefill instance with the
// lowest λ·(1−hit) + (1−λ)·queue, the decode instance with the lowest
// gpu_cache_usage_perc + queue. It is safe for concurrent use.
type CAR struct {
	lambda     float64
	hostWeight float64
	view       atomic.Pointer[viewBox]
	// Tie turns of the two sides, independent so that a run of prefill
	// ties does not decide which decode instance wins its own ties.
	prefillTurn, decodeTurn atomic.Uint64
	scratch                 scratchPool
	// join is the last snapshot-to-directory join (see joinFor).
	join atomic.Pointer[carJoin]
	// acct is nil unless EnableAccounting turned a part on; acctMu then
	// serialises decisions so a burst's requests see each other.
	acct   *accounting
	acctMu sync.Mutex
	// warmPrompt is the prompt of Warm's dry decisions, zeros.
	warmPrompt []uint32
}

// EnableAccounting turns on the router-side accounting o asks for (see
// the package doc); with neither part on it leaves CAR as it is. It
// must be called before the first Route.
func (c *CAR) EnableAccounting(o AccountingOptions) error {
	if !o.enabled() {
		return nil
	}
	if err := o.Validate(); err != nil {
		return err
	}
	c.acct = newAccounting(o)
	return nil
}

// viewBox lets an interface value be swapped atomically.
type viewBox struct{ v PrefixView }

// NewCAR returns a CAR policy with λ = lambda (--car_prefill_lambda) and
// Host-only hit weight w = hostWeight (--car_host_hit_weight), both in
// [0,1], and no prefix view.
func NewCAR(lambda, hostWeight float64) (*CAR, error) {
	if !(lambda >= 0 && lambda <= 1) { // also rejects NaN
		return nil, fmt.Errorf("lb: --car_prefill_lambda %v is outside [0, 1]", lambda)
	}
	if !(hostWeight >= 0 && hostWeight <= 1) {
		return nil, fmt.Errorf("lb: --car_host_hit_weight %v is outside [0, 1]", hostWeight)
	}
	return &CAR{lambda: lambda, hostWeight: hostWeight, warmPrompt: make([]uint32, warmBlock)}, nil
}

// Release tells CAR that the request of d has ended (its answer is
// complete or it failed), so its uncached prompt tokens stop counting
// in the queue term's token part. Only decisions with a Ticket need it;
// other decisions, and unknown or repeated tickets, are ignored.
func (c *CAR) Release(d Decision) {
	if c.acct == nil || d.Ticket == 0 {
		return
	}
	c.acctMu.Lock()
	defer c.acctMu.Unlock()
	c.acct.release(d.Prefill, d.Ticket)
}

// SetPrefixView sets the directory view CAR queries; nil (or an
// interface holding a nil pointer) disables the cache term, so every hit
// ratio is 0 (R-CFG-1). It may be called while requests are routed.
func (c *CAR) SetPrefixView(v PrefixView) {
	if isNilView(v) {
		c.view.Store(nil)
		return
	}
	c.view.Store(&viewBox{v})
}

// Name returns "CAR".
func (c *CAR) Name() string { return PolicyCAR }

// Lambda returns λ, the weight of the cache-miss term.
func (c *CAR) Lambda() float64 { return c.lambda }

// HostHitWeight returns w, the weight of Host-only hit tokens.
func (c *CAR) HostHitWeight() float64 { return c.hostWeight }

const (
	reasonCARLowest     = "lowest cost"
	reasonCARTied       = "lowest cost, tie rotated"
	reasonCARAlone      = "lowest cost; DEFAULT serves alone"
	reasonCARAloneTied  = "lowest cost, tie rotated; DEFAULT serves alone"
	reasonCARDecodeTied = "lowest cost; decode tie rotated"
	reasonCARBothTied   = "lowest cost, tie rotated; decode tie rotated"
)

// Route chooses by cost (lower wins). Prefill candidates are DEFAULT,
// PREFILL and MIX-as-PREFILL instances that are schedulable and have a
// valid load report; they compete on one score whatever their type. A
// PREFILL winner gets the cheapest decode instance of its backend; a
// DEFAULT winner serves alone. The directory is queried at most once.
func (c *CAR) Route(req Request, snap *instance.Snapshot) (Decision, error) {
	return c.decide(req, snap, false)
}

// warmBlock is the length of a dry decision's prompt: the largest
// block_size a KV events config accepts, so that every key group's walk
// hashes the prompt's first block and looks it up.
const warmBlock = 4096

// Warm makes a dry decision over snap: every step of Route on a fixed
// prompt, with no effect on later decisions. It takes no tie turn and
// records no dispatch (it leaves the accounting alone), and the join of
// snap with the directory's layout it may make is the one the next
// decision on snap would make. It reads the state a decision reads, so
// that a decision soon after finds it in the processor's caches (see
// KeepWarm). It does not allocate.
func (c *CAR) Warm(snap *instance.Snapshot) {
	_, _ = c.decide(Request{TokenIDs: c.warmPrompt}, snap, true)
}

// decide is Route, or with dry Warm: a dry decision has no effect and
// returns no error.
func (c *CAR) decide(req Request, snap *instance.Snapshot, dry bool) (Decision, error) {
	s := c.scratch.get()
	defer c.scratch.put(s)
	s.collect(snap, true)
	if len(s.p) == 0 {
		if dry {
			return Decision{}, nil
		}
		return Decision{}, s.noPrefillError(true)
	}
	prefillTurn, decodeTurn := &c.prefillTurn, &c.decodeTurn
	if dry {
		prefillTurn, decodeTurn = nil, nil
	}

	// The directory query and the prompt's block keys, the costly part
	// of a decision, need no accounting state, so they are done before
	// acctMu is taken: decisions serialise only on the few steps that
	// read and record what was dispatched, and a Release waits for no
	// query.
	c.hitRatios(req.TokenIDs, snap, s)
	a := c.acct
	if dry {
		a = nil
	}
	pending := a != nil && a.opts.PendingPrefixes && c.pendingKeys(req.TokenIDs, s)

	// The queue term is normalised over the instances that can actually
	// be chosen, so an excluded instance's queue does not scale the
	// others'.
	var now int64
	if a == nil {
		queueCosts(s.p)
	} else {
		c.acctMu.Lock()
		defer c.acctMu.Unlock()
		now = a.since(a.now())
		a.sync(snap)
		a.queueCosts(s.p, s.scanned, now)
		if pending {
			a.pendingHits(s, len(req.TokenIDs), now)
		}
	}
	for i := range s.p {
		p := &s.p[i]
		p.score = c.lambda*(1-p.hit) + (1-c.lambda)*p.score
	}
	pi, pTied := pick(s.p, prefillTurn)
	p := &s.p[pi]
	d := Decision{
		Prefill:      p.inst.Name(),
		Policy:       PolicyCAR,
		HitRatio:     p.known,
		PrefillScore: p.score,
	}
	if a != nil {
		a.tickets++
		d.Ticket = a.tickets
		a.record(p, req.InputTokens(), s.keys, now, d.Ticket)
	}
	if !p.needsDecode {
		d.Reason = pickReason(pTied, reasonCARAlone, reasonCARAloneTied)
		return d, nil
	}

	// collect kept p only because a decode candidate of its backend
	// exists, so ds is not empty.
	ds := s.decodeFor(p.backend)
	queueCosts(ds)
	for i := range ds {
		ds[i].score += ds[i].inst.Load.GPUCacheUsagePerc
	}
	di, dTied := pick(ds, decodeTurn)
	d.Decode = ds[di].inst.Name()
	d.DecodeScore = ds[di].score
	switch {
	case pTied && dTied:
		d.Reason = reasonCARBothTied
	case pTied:
		d.Reason = reasonCARTied
	case dTied:
		d.Reason = reasonCARDecodeTied
	default:
		d.Reason = reasonCARLowest
	}
	return d, nil
}

func pickReason(tied bool, plain, rotated string) string {
	if tied {
		return rotated
	}
	return plain
}

// hitRatios sets the hit ratio of every prefill candidate in s.p from
// one directory query. Without a view, without token ids, or for any
// fault of a stream, the ratio is 0: the cache term only ever loses its
// benefit, and routing goes on (R-CAR-8).
//
// An instance's ratio is the minimum over its DP ranks' streams, since a
// request cannot choose the DP that serves it, and 0 when any rank is
// missing, unsynchronised or of another incarnation (R-CAR-6, R-CAR-7):
// which streams those are is the join, kept between decisions, so a
// decision reads only the candidates and the streams' dense hits.
func (c *CAR) hitRatios(tokenIDs []uint32, snap *instance.Snapshot, s *scratch) {
	// Candidates start with hit 0.
	box := c.view.Load()
	if box == nil || len(tokenIDs) == 0 {
		return
	}
	layout, hits := box.v.Hits(tokenIDs, s.hits[:0])
	s.hits = hits
	if layout == nil || len(hits) != len(layout.Streams) {
		return // not a layout this view's answer can be read by
	}
	j := c.joinFor(snap, layout)
	input := float64(len(tokenIDs))
	for i := range s.p {
		p := &s.p[i]
		sp := j.spans[p.idx]
		if sp.lo == sp.hi {
			continue
		}
		hit := 1.0
		for _, h := range hits[sp.lo:sp.hi] {
			if !h.OK {
				hit = 0
				break
			}
			hit = min(hit, clamp01((float64(h.DeviceTokens)+c.hostWeight*float64(h.HostOnlyTokens))/input))
		}
		p.hit = hit
		p.known = hit
	}
}

// sameIncarnation reports whether the stream of m belongs to the
// instance's current process, by the rule of
// instance.Instance.Incarnation (incarnation_id, else register_ts_ms in
// decimal) but without allocating, as it runs for every stream. When
// the identities differ, one side having none included, it does not.
// When neither has one, only a discovered stream matches: discovery
// subscribed it for this registration and relies on reconnect and
// snapshot to notice a new process at the address (R-DISC-5), while a
// static stream has no tie to the registry and gives no routing benefit
// (R-CAR-7).
func sameIncarnation(in *instance.Instance, inc string, discovered bool) bool {
	if inc == "" {
		return discovered && in.Meta.IncarnationID == "" && in.Meta.RegisterTsMs == 0
	}
	if id := in.Meta.IncarnationID; id != "" {
		return inc == id
	}
	if ts := in.Meta.RegisterTsMs; ts != 0 {
		var buf [20]byte // the longest int64 in decimal
		return string(strconv.AppendInt(buf[:0], ts, 10)) == inc
	}
	return false
}

func clamp01(x float64) float64 {
	switch {
	case !(x > 0): // also NaN
		return 0
	case x > 1:
		return 1
	}
	return x
}
