package lb

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/kvcar/kvcar/internal/instance"
	"github.com/kvcar/kvcar/internal/kvdir"
)

// scoreEpsilon is how close two scores must be to count as a tie
// (R-CAR-5): float sums of equal terms taken in another order may
// differ in the last bits.
const scoreEpsilon = 1e-12

// defaultBackend is the backend_type of an instance whose meta leaves it
// empty, as the registry defaults it.
const defaultBackend = "xllm"

// side is where an instance can serve a request.
type side int

const (
	sideNone    side = iota
	sidePrefill      // DEFAULT, PREFILL, MIX playing PREFILL
	sideDecode       // DECODE, MIX playing DECODE
)

// sideOf places an instance by its type, and a MIX instance by its
// current role (R-CAR-2). A MIX instance with a role other than PREFILL
// or DECODE is malformed and serves nowhere.
func sideOf(b *instance.Brief) side {
	switch t := b.Type(); {
	case t == instance.Default, t == instance.Prefill, t == instance.Mix && b.Role() == instance.Prefill:
		return sidePrefill
	case t == instance.Decode, t == instance.Mix && b.Role() == instance.Decode:
		return sideDecode
	}
	return sideNone
}

func backendOf(b *instance.Brief) string {
	if b.BackendType == "" {
		return defaultBackend
	}
	return b.BackendType
}

// candidate is one instance under consideration, with the values the
// policies score it by.
type candidate struct {
	inst *instance.Instance
	// idx is the instance's index in the snapshot.
	idx int
	// waiting is the instance's waiting_requests_num, copied so that
	// scoring reads the candidate list only.
	waiting uint64
	// backend is the instance's backend_type: a prefill instance hands
	// its KV only to a decode instance of the same engine kind.
	backend string
	// needsDecode is true for PREFILL and MIX-as-PREFILL: only DEFAULT
	// may serve without a decode instance (R-CAR-2).
	needsDecode bool
	// score is the primary cost (lower wins); tie is the secondary cost
	// compared only when the primary ties.
	score, tie float64
	// hit is the CAR hit ratio; pred a SLO_AWARE prediction in ms and
	// load the SLO_AWARE decode load.
	hit, pred, load float64
	// known is the hit ratio the directory reports, hit less any
	// pending prefix (the Decision's HitRatio).
	known float64
}

// exclusions counts the instances a scan left out, for the error that
// says why no candidate remained.
type exclusions struct {
	suspect, noLoad, invalidLoad int
	// noDecode counts PREFILL/MIX-as-PREFILL instances left out because
	// no decode candidate of their backend exists.
	noDecode int
}

// scratch is one decision's working memory, pooled so that a decision
// allocates nothing once the pool is warm.
type scratch struct {
	p, d []candidate
	hits []kvdir.Hit
	// briefs holds the briefs of a snapshot that came without them;
	// scanned are the briefs collect read, the snapshot's or these.
	briefs, scanned []instance.Brief
	// keys are the request's block chain keys, for pending prefixes.
	keys []uint64
	pEx  exclusions
	dEx  exclusions
}

// scratchPool is a policy's own pool of scratch, so that no state is
// shared between policy values.
type scratchPool struct{ pool sync.Pool }

func (sp *scratchPool) get() *scratch {
	if s, ok := sp.pool.Get().(*scratch); ok {
		return s
	}
	return new(scratch)
}

func (sp *scratchPool) put(s *scratch) {
	// Drop the references into the snapshot so a pooled scratch keeps no
	// old view alive (hits hold none). Elements past the lengths were
	// cleared when the slices were shortened.
	clear(s.p)
	clear(s.d)
	clear(s.briefs)
	s.p, s.d, s.hits, s.keys, s.briefs, s.scanned = s.p[:0], s.d[:0], s.hits[:0], s.keys[:0], s.briefs[:0], nil
	s.pEx, s.dEx = exclusions{}, exclusions{}
	sp.pool.Put(s)
}

// collect fills s.p and s.d with the candidates of snap (R-CAR-2): only
// schedulable instances, and, when needLoad, only those with a valid
// load report. Then it drops the prefill instances that need a decode
// instance none can provide, so every remaining prefill candidate can be
// chosen. Candidates keep the snapshot's name order.
func (s *scratch) collect(snap *instance.Snapshot, needLoad bool) {
	if snap == nil {
		return
	}
	// The briefs, not the Instances: a scan reads 48 contiguous bytes of
	// each instance rather than lines of 400-byte structures.
	bs := snap.Briefs()
	if bs == nil {
		s.briefs = instance.AppendBriefs(s.briefs[:0], snap.Instances)
		bs = s.briefs
	}
	s.scanned = bs
	for i := range bs {
		b := &bs[i]
		sd := sideOf(b)
		if sd == sideNone {
			continue
		}
		ex := &s.pEx
		if sd == sideDecode {
			ex = &s.dEx
		}
		switch {
		case !b.Schedulable():
			ex.suspect++
			continue
		case needLoad && !b.HasLoad:
			ex.noLoad++
			continue
		case needLoad && !b.LoadValid:
			ex.invalidLoad++
			continue
		}
		c := candidate{inst: &snap.Instances[i], idx: i, waiting: b.WaitingRequests, backend: backendOf(b)}
		if sd == sideDecode {
			s.d = append(s.d, c)
			continue
		}
		c.needsDecode = b.Type() != instance.Default
		s.p = append(s.p, c)
	}
	// Compact in place, copying only after the first removal: usually
	// nothing is removed.
	w := 0
	for r := range s.p {
		if s.p[r].needsDecode && !s.hasDecode(s.p[r].backend) {
			s.pEx.noDecode++
			continue
		}
		if w != r {
			s.p[w] = s.p[r]
		}
		w++
	}
	clear(s.p[w:])
	s.p = s.p[:w]
}

func (s *scratch) hasDecode(backend string) bool {
	for i := range s.d {
		if s.d[i].backend == backend {
			return true
		}
	}
	return false
}

// decodeFor keeps in s.d only the decode candidates that can take over
// from a prefill instance of backend, and returns them.
func (s *scratch) decodeFor(backend string) []candidate {
	kept := s.d[:0]
	for _, c := range s.d {
		if c.backend == backend {
			kept = append(kept, c)
		}
	}
	clear(s.d[len(kept):])
	s.d = kept
	return kept
}

// noPrefillError explains why no prefill candidate remained.
func (s *scratch) noPrefillError(needLoad bool) error {
	what := "no schedulable PREFILL or DEFAULT instance"
	if needLoad {
		what += " with a load report"
	}
	why := s.pEx.reasons(nil)
	if n := s.pEx.noDecode; n > 0 {
		d := "no schedulable DECODE instance"
		if needLoad {
			d += " with a load report"
		}
		r := strconv.Itoa(n) + " PREFILL that need a decode instance, but " + d +
			" of their backend_type exists and only DEFAULT may serve alone"
		if dw := s.dEx.reasons(nil); len(dw) > 0 {
			r += " [decode instances excluded: " + strings.Join(dw, ", ") + "]"
		}
		why = append(why, r)
	}
	if len(why) == 0 {
		return fmt.Errorf("%w: %s (none registered)", ErrNoCandidate, what)
	}
	return fmt.Errorf("%w: %s (excluded: %s)", ErrNoCandidate, what, strings.Join(why, "; "))
}

func (ex *exclusions) reasons(dst []string) []string {
	if n := ex.suspect; n > 0 {
		dst = append(dst, strconv.Itoa(n)+" SUSPECT")
	}
	if n := ex.noLoad; n > 0 {
		dst = append(dst, strconv.Itoa(n)+" without a first load report")
	}
	if n := ex.invalidLoad; n > 0 {
		dst = append(dst, strconv.Itoa(n)+" with an invalid load report")
	}
	return dst
}

// queueCosts sets each candidate's score to waiting / max(waiting over
// cands), 0 when every queue is empty (R-CAR-3, R-CAR-4). It is the
// normalised queue term both CAR sides use.
func queueCosts(cands []candidate) {
	var maxWaiting uint64
	for i := range cands {
		maxWaiting = max(maxWaiting, cands[i].waiting)
	}
	if maxWaiting == 0 {
		for i := range cands {
			cands[i].score = 0
		}
		return
	}
	for i := range cands {
		cands[i].score = float64(cands[i].waiting) / float64(maxWaiting)
	}
}

// pick returns the index of the candidate with the lowest (score, tie).
// Candidates within scoreEpsilon on both costs are tied; the counter
// picks among them in turn, so none is permanently preferred
// (R-CAR-5). The second result reports whether there was a tie. A nil
// turn takes no turn: the first of the tied is returned.
func pick(cands []candidate, turn *atomic.Uint64) (int, bool) {
	best := 0
	for i := 1; i < len(cands); i++ {
		if less(&cands[i], &cands[best]) {
			best = i
		}
	}
	tied := 0
	for i := range cands {
		if same(&cands[i], &cands[best]) {
			tied++
		}
	}
	if tied <= 1 {
		return best, false
	}
	if turn == nil {
		return best, true
	}
	k := int((turn.Add(1) - 1) % uint64(tied))
	for i := range cands {
		if same(&cands[i], &cands[best]) {
			if k == 0 {
				return i, true
			}
			k--
		}
	}
	return best, true // unreachable: k < tied
}

func less(a, b *candidate) bool {
	if !near(a.score, b.score) {
		return a.score < b.score
	}
	return !near(a.tie, b.tie) && a.tie < b.tie
}

func same(a, b *candidate) bool { return near(a.score, b.score) && near(a.tie, b.tie) }

func near(a, b float64) bool {
	return a == b || math.Abs(a-b) <= scoreEpsilon
}
