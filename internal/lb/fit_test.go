package lb

import (
	"fmt"
	"math"
	"testing"

	"github.com/kvcar/kvcar/internal/instance"
)

func wantCoef(t *testing.T, got, want [3]float64) {
	t.Helper()
	for i := range got {
		if math.Abs(got[i]-want[i]) > 1e-9*math.Max(math.Abs(want[i]), 1e-9) {
			t.Fatalf("coefficients %v, want %v", got, want)
		}
	}
}

// R-CAR-9: the TTFT fit recovers a known quadratic exactly.
func TestFitTTFTRecoversQuadratic(t *testing.T) {
	want := [3]float64{35, 0.012, 3e-6}
	var pts []instance.TTFTPoint
	for _, n := range []int{128, 512, 1024, 2048, 4096, 8192, 16384, 32768} {
		x := float64(n)
		pts = append(pts, instance.TTFTPoint{InputLen: n, TTFTMs: want[0] + want[1]*x + want[2]*x*x})
	}
	m := FitTTFT(pts)
	wantCoef(t, m.Coef, want)
	wantFloat(t, "PredictMs(3000)", m.PredictMs(3000), 35+0.012*3000+3e-6*3000*3000)
}

// R-CAR-9: with noisy points the fit is the least-squares one. The noise
// (−1, 2, 0, −2, 1)·k on five equally spaced lengths is orthogonal to 1,
// n and n², so the best quadratic is still the one without noise.
func TestFitTTFTLeastSquares(t *testing.T) {
	want := [3]float64{10, 0.05, 1e-5}
	noise := []float64{-1, 2, 0, -2, 1}
	var pts []instance.TTFTPoint
	for i, e := range noise {
		n := 1000 + 1000*i
		x := float64(n)
		pts = append(pts, instance.TTFTPoint{InputLen: n, TTFTMs: want[0] + want[1]*x + want[2]*x*x + 7*e})
	}
	wantCoef(t, FitTTFT(pts).Coef, want)
}

// R-CAR-9: fewer distinct lengths than coefficients lower the degree
// instead of failing the fit.
func TestFitTTFTFallbacks(t *testing.T) {
	for _, tc := range []struct {
		name string
		pts  []instance.TTFTPoint
		want [3]float64
	}{
		{"none", nil, [3]float64{}},
		{"one point: constant", ttftProfile([2]float64{1000, 80}), [3]float64{80, 0, 0}},
		{"one length: mean", ttftProfile([2]float64{1000, 80}, [2]float64{1000, 100}, [2]float64{1000, 120}), [3]float64{100, 0, 0}},
		// Through (1000, 80) and (3000, 200): slope 0.06, intercept 20.
		{"two points: line", ttftProfile([2]float64{1000, 80}, [2]float64{3000, 200}), [3]float64{20, 0.06, 0}},
		// Through (1000, mean 90) and (3000, 200): slope 0.055, intercept 35.
		{"two lengths: line", ttftProfile([2]float64{1000, 80}, [2]float64{1000, 100}, [2]float64{3000, 200}), [3]float64{35, 0.055, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) { wantCoef(t, FitTTFT(tc.pts).Coef, tc.want) })
	}
	if got := (TTFTModel{}).PredictMs(4096); got != 0 {
		t.Fatalf("zero model predicts %v", got)
	}
	if got := (TTFTModel{Coef: [3]float64{-100, 0.1, 0}}).PredictMs(500); got != 0 {
		t.Fatalf("negative prediction not clamped: %v", got)
	}
}

// R-CAR-9: the TPOT fit recovers a known plane exactly, with tokens =
// batch × (avg_len − 1) as xllm-service counts them.
func TestFitTPOTRecoversPlane(t *testing.T) {
	want := [3]float64{8, 0.5, 0.0004}
	var pts []instance.TPOTPoint
	for _, l := range []int{1, 256, 1024, 4096} {
		for _, b := range []int{1, 8, 32} {
			tokens := float64(b * (l - 1))
			pts = append(pts, instance.TPOTPoint{AvgLen: l, BatchSize: b, TPOTMs: want[0] + want[1]*float64(b) + want[2]*tokens})
		}
	}
	m := FitTPOT(pts)
	wantCoef(t, m.Coef, want)
	wantFloat(t, "PredictMs(20000, 10)", m.PredictMs(20000, 10), 8+0.5*10+0.0004*20000)
}

// R-CAR-9: a profile of one batch size cannot separate the batch term
// from the constant; the fit still predicts that batch size exactly.
func TestFitTPOTSingleBatchSize(t *testing.T) {
	var pts []instance.TPOTPoint
	for _, l := range []int{256, 1024, 4096} {
		pts = append(pts, instance.TPOTPoint{AvgLen: l, BatchSize: 16, TPOTMs: 8 + 0.5*16 + 0.0004*float64(16*(l-1))})
	}
	m := FitTPOT(pts)
	wantCoef(t, m.Coef, [3]float64{16, 0, 0.0004})
	wantFloat(t, "PredictMs", m.PredictMs(16*2000, 16), 8+0.5*16+0.0004*16*2000)
	if got := FitTPOT(nil); got != (TPOTModel{}) {
		t.Fatalf("FitTPOT(nil) = %v", got)
	}
}

func ExampleFitTTFT() {
	// Profiled on TTFT = 20 + 0.02·n + 1e-5·n² ms.
	m := FitTTFT([]instance.TTFTPoint{{InputLen: 1000, TTFTMs: 50}, {InputLen: 2000, TTFTMs: 100}, {InputLen: 4000, TTFTMs: 260}})
	fmt.Printf("%.1f ms\n", m.PredictMs(3000))
	// Output: 170.0 ms
}
