package lb

import (
	"sync/atomic"

	"github.com/kvcar/kvcar/internal/instance"
)

// RR is round robin (R-CAR-9): prefill instances (DEFAULT, PREFILL,
// MIX-as-PREFILL) in turn and, independently, decode instances in turn,
// skipping SUSPECT instances. Like xllm-service's round robin it does
// not need load reports, so instances are routed before their first
// heartbeat. It is safe for concurrent use.
type RR struct {
	prefillTurn, decodeTurn atomic.Uint64
	scratch                 scratchPool
}

// NewRR returns a round-robin policy whose turns start at the first
// instance by name.
func NewRR() *RR { return &RR{} }

// Name returns "RR".
func (r *RR) Name() string { return PolicyRR }

const (
	reasonRR      = "round robin"
	reasonRRAlone = "round robin; DEFAULT serves alone"
)

// Route takes the next prefill candidate in name order. The turn counts
// over the candidates of the current snapshot: an instance joining or
// leaving shifts whose turn is next, and no list of skipped slots has to
// be kept. Only prefill candidates that can be served take turns: a
// PREFILL without a decode instance of its backend is skipped. A PREFILL winner takes the next decode instance of its
// backend; a DEFAULT winner serves alone and takes no decode turn.
func (r *RR) Route(req Request, snap *instance.Snapshot) (Decision, error) {
	s := r.scratch.get()
	defer r.scratch.put(s)
	s.collect(snap, false)
	if len(s.p) == 0 {
		return Decision{}, s.noPrefillError(false)
	}
	p := &s.p[turn(&r.prefillTurn, len(s.p))]
	d := Decision{Prefill: p.inst.Name(), Policy: PolicyRR, Reason: reasonRRAlone}
	if !p.needsDecode {
		return d, nil
	}
	ds := s.decodeFor(p.backend)
	d.Decode = ds[turn(&r.decodeTurn, len(ds))].inst.Name()
	d.Reason = reasonRR
	return d, nil
}

// turn returns the index whose turn it is among n > 0 candidates.
func turn(counter *atomic.Uint64, n int) int {
	return int((counter.Add(1) - 1) % uint64(n))
}
