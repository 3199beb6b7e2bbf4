package lb

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/instance"
	"github.com/kvcar/kvcar/internal/kvdir"
)

// benchCluster is nPrefill PREFILL instances of dp ranks each, with one
// synchronised stream per rank holding some prefix, and nDecode DECODE
// instances, all with profiles and varied loads.
func benchCluster(nPrefill, dp, nDecode int) (*instance.Snapshot, *matches) {
	var ins []instance.Instance
	var ms []kvdir.Match
	ttft := ttftProfile([2]float64{128, 20}, [2]float64{1024, 90}, [2]float64{4096, 420}, [2]float64{8192, 1100})
	tpot := tpotProfile([3]float64{256, 1, 12}, [3]float64{1024, 8, 18}, [3]float64{4096, 32, 40}, [3]float64{2048, 16, 25})
	for i := range nPrefill {
		name := fmt.Sprintf("10.0.%d.%d:8000", i/200, i%200)
		in := withDP(loaded(name, P, uint64(i%7), float64(i%10)/10), dp)
		in.Meta.TTFTProfile = ttft
		ins = append(ins, in)
		for r := range dp {
			// The directory's names and incarnations are its own strings,
			// not the registry's, as in kvcar: comparing them reads both.
			m := match(strings.Clone(name), r, 128*((i+r)%16), 128*(i%3))
			m.Incarnation = strings.Clone(m.Incarnation)
			ms = append(ms, m)
		}
	}
	for i := range nDecode {
		in := loaded(fmt.Sprintf("10.1.%d.%d:8000", i/200, i%200), D, uint64(i%5), float64(i%10)/10)
		in.Meta.TPOTProfile = tpot
		ins = append(ins, in)
	}
	return snapshot(ins...), newMatches(ms...)
}

// The decision path over 64 instances × 2 DP ranks (128 streams) and 16
// decode instances.
func BenchmarkCARRoute64x2(b *testing.B) {
	snap, view := benchCluster(64, 2, 16)
	c := mustCAR(b, 0.5, 0.5, view)
	req := Request{TokenIDs: tokens(2048)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Route(req, snap); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCARRoute64x2Cold is BenchmarkCARRoute64x2 with the caches
// evicted before each decision, as a router's sparse decisions find the
// snapshot and the directory's answer; p50 and p99 per decision.
func BenchmarkCARRoute64x2Cold(b *testing.B) {
	snap, view := benchCluster(64, 2, 16)
	c := mustCAR(b, 0.5, 0.5, view)
	req := Request{TokenIDs: tokens(2048)}
	evict := make([]byte, coldBytes)
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		for j := 0; j < len(evict); j += 64 {
			evict[j]++
		}
		b.StartTimer()
		t0 := time.Now()
		if _, err := c.Route(req, snap); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	reportLatency(b, lat)
}

// coldBytes is what the cold benchmarks write over before each step:
// more than any last-level cache of the machines they run on.
const coldBytes = 64 << 20

func reportLatency(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
}

func BenchmarkCARRoute64x2Parallel(b *testing.B) {
	snap, view := benchCluster(64, 2, 16)
	c := mustCAR(b, 0.5, 0.5, view)
	req := Request{TokenIDs: tokens(2048)}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.Route(req, snap); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkRRRoute64x2(b *testing.B) {
	snap, _ := benchCluster(64, 2, 16)
	r := NewRR()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Route(Request{}, snap); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSLOAwareRoute64x2(b *testing.B) {
	snap, _ := benchCluster(64, 2, 16)
	p, err := NewSLOAware(DefaultTargetTTFTms, DefaultTargetTPOTms)
	if err != nil {
		b.Fatal(err)
	}
	req := Request{PromptTokens: 2048}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Route(req, snap); err != nil {
			b.Fatal(err)
		}
	}
}

// The one-off cost when a new snapshot arrives: every fit carried over.
func BenchmarkSLOAwareNewSnapshot64x2(b *testing.B) {
	snap, _ := benchCluster(64, 2, 16)
	p, _ := NewSLOAware(DefaultTargetTTFTms, DefaultTargetTPOTms)
	p.fitsFor(snap)
	b.ReportAllocs()
	for b.Loop() {
		next := *snap
		next.Version++
		snap = &next
		p.fitsFor(snap)
	}
}

// The decision path with accounting, from both cores at once: the
// directory query and the prompt's keys are computed outside the
// accounting lock, so decisions contend only on the steps that read and
// record dispatches. Each decision's ticket is released, as the server
// does at request end, but its record stays in the ring until it ages
// out, so the ring is full, as after a burst. tok is the recommended
// setting (dispatches with token weight 0.5), tok+pend adds pending
// prefixes.
func BenchmarkCARRouteAccounting64x2Parallel(b *testing.B) {
	for _, pend := range []bool{false, true} {
		name := "tok"
		if pend {
			name = "tok+pend"
		}
		b.Run(name, func(b *testing.B) { benchAccounting(b, pend) })
	}
}

func benchAccounting(b *testing.B, pend bool) {
	snap, view := benchCluster(64, 2, 16)
	c := mustCAR(b, 0.5, 0.5, view)
	o := DefaultAccountingOptions()
	o.Dispatched, o.TokenWeight, o.PendingPrefixes = true, 0.5, pend
	if err := c.EnableAccounting(o); err != nil {
		b.Fatal(err)
	}
	req := Request{TokenIDs: tokens(2048)}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			d, err := c.Route(req, snap)
			if err != nil {
				b.Error(err)
				return
			}
			c.Release(d)
		}
	})
}

// BenchmarkChainKeys keys the 64 blocks of an 8,192-id prompt for
// pending prefixes (--car_pending_prefixes), as a decision does.
func BenchmarkChainKeys(b *testing.B) {
	ids := tokens(8192)
	var dst []uint64
	b.ReportAllocs()
	for range b.N {
		dst = chainKeys(ids, DefaultAccountingBlockSize, dst[:0])
	}
}
