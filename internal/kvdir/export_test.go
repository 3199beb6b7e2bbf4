package kvdir

import (
	"testing"
	"time"
)

// RealSizeDirectory is the directory of BenchmarkQueryRealSize for the
// benchmarks of the external test package, which route over it with lb
// (an import kvdir's own tests cannot make): 128 published streams of
// perStream blocks each, instance names "10.0.x.y:8000" with
// incarnations "inc-<name>", and prompts returns realPrompts prompts of
// a kind ("all", "half", "none", "one").
func RealSizeDirectory(tb testing.TB, perStream int) (d *Directory, prompts func(kind string) [][]uint32) {
	r := buildRealDirectory(tb, perStream)
	return r.d, func(kind string) [][]uint32 {
		p, _ := r.prompts(kind)
		return p
	}
}

// ColdBytes is what the cold benchmarks write over before each step.
const ColdBytes = coldBytes

// ReportLatency reports a run's p50, p99 and the machine's bound on the
// p99 (see reportLatency).
func ReportLatency(b *testing.B, lat []time.Duration) { reportLatency(b, lat) }
