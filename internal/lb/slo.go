package lb

import (
	"fmt"
	"math"
	"sync/atomic"

	"github.com/kvcar/kvcar/internal/instance"
)

// SLOAware routes on predicted latencies against the TTFT and TPOT
// targets (R-CAR-9), from each instance's ttft_profiling_data and
// tpot_profiling_data. It is safe for concurrent use.
//
// Prefill: an instance's predicted TTFT for an n-token prompt is the
// fitted TTFT(n) × (waiting + 1): the request waits behind the
// instance's queue, each queued prompt taken to cost as much as this
// one. xllm-service keeps a running sum of the predicted TTFTs it has
// dispatched instead; a policy here sees only the registry's load
// reports, whose waiting_requests_num is the same queue measured by the
// engine. Among the instances whose prediction meets --target_ttft, the
// one with the fewest waiting requests wins (then the lower prediction),
// so load spreads while the target holds; when none meets it, the
// lowest prediction wins.
//
// Decode: the predicted TPOT is the fitted TPOT(batch, tokens) with the
// request joining the instance's queue: batch = waiting + 1 and tokens =
// batch × n, again each request taken to be like this one. Among the
// instances that meet --target_tpot the least loaded by CAR's decode
// cost (gpu_cache_usage_perc + normalised queue) wins, then the lower
// prediction; when none meets it, the lowest prediction wins.
// xllm-service instead packs requests onto the first decode instance
// that meets the target, so that idle ones can be flipped to prefill;
// flipping MIX roles needs per-request lifecycle tracking and a write to
// the registry, which a pure policy does not do, and without the flip,
// packing only lengthens the TPOT of the instance packed.
//
// An instance without a profile predicts 0 ms, as in xllm-service, so it
// always meets the target and competes on load alone. A request whose
// prompt length is unknown (no token ids, PromptTokens 0) is routed
// round robin, as xllm-service does. Candidates follow the rules shared
// with CAR: schedulable, with a valid load report.
type SLOAware struct {
	targetTTFTms, targetTPOTms float64
	fits                       atomic.Pointer[fitTable]
	prefillTurn, decodeTurn    atomic.Uint64
	scratch                    scratchPool
	// fallback routes requests of unknown length.
	fallback RR
}

// NewSLOAware returns a SLO_AWARE policy with the given --target_ttft
// and --target_tpot, in ms, both non-negative.
func NewSLOAware(targetTTFTms, targetTPOTms int) (*SLOAware, error) {
	if targetTTFTms < 0 {
		return nil, fmt.Errorf("lb: --target_ttft %d ms is negative", targetTTFTms)
	}
	if targetTPOTms < 0 {
		return nil, fmt.Errorf("lb: --target_tpot %d ms is negative", targetTPOTms)
	}
	return &SLOAware{targetTTFTms: float64(targetTTFTms), targetTPOTms: float64(targetTPOTms)}, nil
}

// Name returns "SLO_AWARE".
func (p *SLOAware) Name() string { return PolicySLOAware }

// Fixed reasons, indexed by whether the TTFT target was met and by the
// decode outcome, so that a decision builds no string.
const (
	decodeAlone = iota
	decodeMet
	decodeMissed
)

var sloReasons = [2][3]string{
	{
		decodeAlone:  "no instance meets the TTFT target, fastest predicted; DEFAULT serves alone",
		decodeMet:    "no instance meets the TTFT target, fastest predicted; TPOT target met, least loaded",
		decodeMissed: "no instance meets the TTFT target, fastest predicted; no instance meets the TPOT target, fastest predicted",
	},
	{
		decodeAlone:  "TTFT target met, least loaded; DEFAULT serves alone",
		decodeMet:    "TTFT target met, least loaded; TPOT target met, least loaded",
		decodeMissed: "TTFT target met, least loaded; no instance meets the TPOT target, fastest predicted",
	},
}

const reasonSLOUnknownLength = "prompt length unknown, round robin"

// Route chooses on predicted latencies; see SLOAware.
func (p *SLOAware) Route(req Request, snap *instance.Snapshot) (Decision, error) {
	// Bounded so that batch × n below cannot overflow; no prompt is
	// anywhere near 2³¹ tokens.
	n := min(req.InputTokens(), math.MaxInt32)
	if n == 0 {
		d, err := p.fallback.Route(req, snap)
		if err == nil {
			d.Policy, d.Reason = PolicySLOAware, reasonSLOUnknownLength
		}
		return d, err
	}
	s := p.scratch.get()
	defer p.scratch.put(s)
	s.collect(snap, true)
	if len(s.p) == 0 {
		return Decision{}, s.noPrefillError(true)
	}
	fits := p.fitsFor(snap)

	met := false
	for i := range s.p {
		c := &s.p[i]
		waiting := float64(c.waiting)
		c.pred = fits.fits[c.idx].ttft.PredictMs(n) * (waiting + 1)
		met = met || c.pred <= p.targetTTFTms
	}
	for i := range s.p {
		c := &s.p[i]
		waiting := float64(c.waiting)
		switch {
		case !met:
			c.score, c.tie = c.pred, waiting
		case c.pred <= p.targetTTFTms:
			c.score, c.tie = waiting, c.pred
		default:
			c.score, c.tie = math.Inf(1), 0
		}
	}
	pi, _ := pick(s.p, &p.prefillTurn)
	pc := &s.p[pi]
	d := Decision{Prefill: pc.inst.Name(), Policy: PolicySLOAware, PrefillScore: pc.pred}
	pMet := 0
	if met {
		pMet = 1
	}
	if !pc.needsDecode {
		d.Reason = sloReasons[pMet][decodeAlone]
		return d, nil
	}

	ds := s.decodeFor(pc.backend)
	queueCosts(ds) // the load of a decode instance, as CAR scores it
	dMet := false
	for i := range ds {
		c := &ds[i]
		c.load = c.score + c.inst.Load.GPUCacheUsagePerc
		batch := int(min(c.waiting, math.MaxInt32)) + 1
		c.pred = fits.fits[c.idx].tpot.PredictMs(batch*n, batch)
		dMet = dMet || c.pred <= p.targetTPOTms
	}
	for i := range ds {
		c := &ds[i]
		switch {
		case !dMet:
			c.score, c.tie = c.pred, c.load
		case c.pred <= p.targetTPOTms:
			c.score, c.tie = c.load, c.pred
		default:
			c.score, c.tie = math.Inf(1), 0
		}
	}
	di, _ := pick(ds, &p.decodeTurn)
	d.Decode, d.DecodeScore = ds[di].inst.Name(), ds[di].pred
	if dMet {
		d.Reason = sloReasons[pMet][decodeMet]
	} else {
		d.Reason = sloReasons[pMet][decodeMissed]
	}
	return d, nil
}

// instanceFits are one instance's fitted models, with what they were
// fitted from: the incarnation and the identity (first element and
// length) of the profile slices, which the registry replaces, never
// modifies, when a registration changes.
type instanceFits struct {
	incarnation string
	ttftFrom    *instance.TTFTPoint
	ttftLen     int
	tpotFrom    *instance.TPOTPoint
	tpotLen     int
	ttft        TTFTModel
	tpot        TPOTModel
}

func (f *instanceFits) fittedFrom(in *instance.Instance, inc string) bool {
	return f.incarnation == inc &&
		f.ttftFrom == first(in.Meta.TTFTProfile) && f.ttftLen == len(in.Meta.TTFTProfile) &&
		f.tpotFrom == first(in.Meta.TPOTProfile) && f.tpotLen == len(in.Meta.TPOTProfile)
}

func first[T any](s []T) *T {
	if len(s) == 0 {
		return nil
	}
	return &s[0]
}

// fitTable holds the fits of every instance of one snapshot, in the
// snapshot's order, so a decision finds a candidate's by its index
// without a map lookup; byName serves only to carry fits over to the
// next snapshot's table.
type fitTable struct {
	snap   *instance.Snapshot
	fits   []instanceFits
	byName map[string]int
}

// fitsFor returns the fit table of snap, building it when snap is new:
// models are fitted once per instance incarnation and profile, and
// carried over from the previous table otherwise. Tables of removed
// instances are dropped with the old table.
func (p *SLOAware) fitsFor(snap *instance.Snapshot) *fitTable {
	old := p.fits.Load()
	if old != nil && old.snap == snap {
		return old
	}
	t := &fitTable{
		snap:   snap,
		fits:   make([]instanceFits, len(snap.Instances)),
		byName: make(map[string]int, len(snap.Instances)),
	}
	for i := range snap.Instances {
		in := &snap.Instances[i]
		inc := in.Incarnation()
		t.byName[in.Meta.Name] = i
		if old != nil {
			if j, ok := old.byName[in.Meta.Name]; ok && old.fits[j].fittedFrom(in, inc) {
				t.fits[i] = old.fits[j]
				continue
			}
		}
		t.fits[i] = instanceFits{
			incarnation: inc,
			ttftFrom:    first(in.Meta.TTFTProfile),
			ttftLen:     len(in.Meta.TTFTProfile),
			tpotFrom:    first(in.Meta.TPOTProfile),
			tpotLen:     len(in.Meta.TPOTProfile),
			ttft:        FitTTFT(in.Meta.TTFTProfile),
			tpot:        FitTPOT(in.Meta.TPOTProfile),
		}
	}
	// Keep the newest snapshot's table: a request still routing on an
	// older snapshot must not make the next ones rebuild.
	if old == nil || snap.Version >= old.snap.Version {
		p.fits.CompareAndSwap(old, t)
	}
	return t
}
