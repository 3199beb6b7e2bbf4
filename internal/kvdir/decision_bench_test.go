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
// buffer, as its parser just wrote it. p50 and p99 per decision.
func BenchmarkDecisionRealSize(b *testing.B) {
	d, prompts := kvdir.RealSizeDirectory(b, 16384)
	snap := snapshotOf(d)
	car, err := lb.NewCAR(lb.DefaultCARPrefillLambda, lb.DefaultCARHostHitWeight)
	if err != nil {
		b.Fatal(err)
	}
	car.SetPrefixView(d)
	for _, kind := range []string{"all", "one", "none", "all-cold", "one-cold", "none-cold"} {
		b.Run(kind, func(b *testing.B) {
			ps := prompts(strings.TrimSuffix(kind, "-cold"))
			var evict []byte
			if strings.HasSuffix(kind, "-cold") {
				evict = make([]byte, kvdir.ColdBytes)
			}
			req := lb.Request{TokenIDs: make([]uint32, len(ps[0]))}
			check, err := car.Route(lb.Request{TokenIDs: ps[0]}, snap)
			if err != nil {
				b.Fatal(err)
			}
			if kind != "none" && kind != "none-cold" && check.HitRatio != 1 {
				b.Fatalf("warm-up decision: %+v, want a whole hit", check)
			}
			lat := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				b.StopTimer()
				for j := 0; j < len(evict); j += 64 {
					evict[j]++
				}
				copy(req.TokenIDs, ps[i%len(ps)])
				i++
				b.StartTimer()
				t0 := time.Now()
				if _, err := car.Route(req, snap); err != nil {
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
// its own and its briefs made, as the registry makes them.
func snapshotOf(d *kvdir.Directory) *instance.Snapshot {
	var ins []instance.Instance
	for _, m := range d.Query(nil, nil) {
		name := strings.Clone(m.InstanceName)
		ins = append(ins, instance.Instance{
			Meta: instance.Meta{Name: name, IncarnationID: strings.Clone(m.Incarnation), DPSize: 1, BackendType: "xllm"},
			Type: instance.Default, Role: instance.Default, State: instance.Active, HasLoad: true, LoadValid: true,
		})
	}
	slices.SortFunc(ins, func(a, b instance.Instance) int { return strings.Compare(a.Meta.Name, b.Meta.Name) })
	return instance.NewSnapshot(ins, 1, true)
}
