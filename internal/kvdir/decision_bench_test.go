package kvdir_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/instance"
	"github.com/kvcar/kvcar/internal/kvdir"
	"github.com/kvcar/kvcar/internal/lb"
)

// BenchmarkDecisionRealSize measures CAR's whole decision, as kvcar makes
// it, over the real-size directory of BenchmarkQueryRealSize (128
// streams of 16,384 blocks, 8k-token prompts) and a registry snapshot of
// its 128 instances: the prompt walked, every instance's hit ratio, the
// pick. The "-cold" kinds evict the caches (ColdBytes written) before
// each decision, untimed, as a router's sparse decisions find the
// directory and the snapshot; the prompt is then copied to the request's
// buffer, as its parser just wrote it. The "-next" kinds decide each time
// on the registry's next snapshot, as after a load report (the instances
// copied, their MetaGens kept, their loads just updated), made before
// the eviction; "-unnamed" ones on snapshots without MetaGens, whose
// instances CAR then compares; "-acct" ones with CAR's dispatch
// accounting on, as --car_dispatch_accounting
// --car_dispatch_token_weight=0.5 turn it on. p50 and p99 per decision.
func BenchmarkDecisionRealSize(b *testing.B) {
	d, prompts := kvdir.RealSizeDirectory(b, 16384)
	snap := snapshotOf(d)
	newCAR := func(o lb.AccountingOptions) *lb.CAR {
		c, err := lb.NewCAR(lb.DefaultCARPrefillLambda, lb.DefaultCARHostHitWeight)
		if err == nil {
			err = c.EnableAccounting(o)
		}
		if err != nil {
			b.Fatal(err)
		}
		c.SetPrefixView(d)
		return c
	}
	plain := newCAR(lb.DefaultAccountingOptions())
	o := lb.DefaultAccountingOptions()
	o.Dispatched, o.TokenWeight = true, 0.5
	accounted := newCAR(o)
	ins := slices.Clone(snap.Instances)
	for i := range ins {
		ins[i].MetaGen = 0
	}
	unnamed := instance.NewSnapshot(ins, snap.Version, true)
	for _, kind := range []string{"all", "one", "none", "all-cold", "one-cold", "none-cold",
		"all-cold-next", "none-cold-next", "all-cold-next-unnamed", "none-cold-next-unnamed",
		"none-cold-acct", "none-cold-next-acct", "none-acct", "all-cold-acct", "all-cold-next-acct"} {
		b.Run(kind, func(b *testing.B) {
			car := plain
			kind, acct := strings.CutSuffix(kind, "-acct")
			if acct {
				car = accounted
			}
			base, rest, _ := strings.Cut(kind, "-")
			ps := prompts(base)
			var evict []byte
			if strings.HasPrefix(rest, "cold") {
				evict = make([]byte, kvdir.ColdBytes)
			}
			from := snap
			if strings.HasSuffix(kind, "-unnamed") {
				from = unnamed
			}
			req := lb.Request{TokenIDs: make([]uint32, len(ps[0]))}
			check, err := car.Route(lb.Request{TokenIDs: ps[0]}, from)
			if err != nil {
				b.Fatal(err)
			}
			if base != "none" && check.HitRatio != 1 {
				b.Fatalf("warm-up decision: %+v, want a whole hit", check)
			}
			lat := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				b.StopTimer()
				use := from
				if strings.Contains(kind, "-next") {
					ins := slices.Clone(from.Instances)
					for j := range ins {
						ins[j].LoadUpdated = time.Now()
					}
					use = instance.NewSnapshot(ins, from.Version+uint64(i)+1, true)
				}
				for j := 0; j < len(evict); j += 64 {
					evict[j]++
				}
				copy(req.TokenIDs, ps[i%len(ps)])
				i++
				b.StartTimer()
				t0 := time.Now()
				if _, err := car.Route(req, use); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			kvdir.ReportLatency(b, lat)
		})
	}
}

// snapshotOf is a registry snapshot of d's instances, DEFAULT with
// valid loads of empty queues and the incarnations their streams follow, its strings
// its own, its Metas named and its briefs made, as the registry makes them.
func snapshotOf(d *kvdir.Directory) *instance.Snapshot {
	var ins []instance.Instance
	for _, m := range d.Query(nil, nil) {
		name := strings.Clone(m.InstanceName)
		ins = append(ins, instance.Instance{
			Meta:    instance.Meta{Name: name, IncarnationID: strings.Clone(m.Incarnation), DPSize: 1, BackendType: "xllm"},
			MetaGen: uint64(len(ins) + 1),
			Type:    instance.Default, Role: instance.Default, State: instance.Active, HasLoad: true, LoadValid: true,
			LoadUpdated: time.Now(),
		})
	}
	slices.SortFunc(ins, func(a, b instance.Instance) int { return strings.Compare(a.Meta.Name, b.Meta.Name) })
	return instance.NewSnapshot(ins, 1, true)
}
