package lb

import (
	"math"

	"github.com/kvcar/kvcar/internal/instance"
)

// TTFTModel predicts the time to first token of a prompt from its
// length: TTFT = Coef[0] + Coef[1]·n + Coef[2]·n². The zero value
// predicts 0, which is what an instance without a profile gets.
type TTFTModel struct {
	Coef [3]float64
}

// PredictMs returns the predicted TTFT in ms of an inputTokens-token
// prompt, never negative: a fitted curve may dip below zero outside the
// profiled range, and a negative time would make the instance look
// better than idle.
func (m TTFTModel) PredictMs(inputTokens int) float64 {
	n := float64(inputTokens)
	return math.Max(0, m.Coef[0]+n*(m.Coef[1]+n*m.Coef[2]))
}

// TPOTModel predicts the time per output token of a decode batch:
// TPOT = Coef[0] + Coef[1]·batch + Coef[2]·tokens, where tokens is the
// total context length of the batch. The zero value predicts 0.
type TPOTModel struct {
	Coef [3]float64
}

// PredictMs returns the predicted TPOT in ms of a batch of batchSize
// requests holding totalTokens tokens, never negative.
func (m TPOTModel) PredictMs(totalTokens, batchSize int) float64 {
	return math.Max(0, m.Coef[0]+m.Coef[1]*float64(batchSize)+m.Coef[2]*float64(totalTokens))
}

// FitTTFT fits ttft_profiling_data [[input_len, ms]] by least squares
// with a polynomial of degree 2 in the input length, as xllm-service's
// predictor does. With fewer distinct lengths than coefficients the
// degree drops: two distinct lengths give the line through them, one a
// constant (their mean time); no points give the zero model.
func FitTTFT(points []instance.TTFTPoint) TTFTModel {
	if len(points) == 0 {
		return TTFTModel{}
	}
	cols := [3][]float64{make([]float64, len(points)), make([]float64, len(points)), make([]float64, len(points))}
	y := make([]float64, len(points))
	for i, p := range points {
		n := float64(p.InputLen)
		cols[0][i], cols[1][i], cols[2][i] = 1, n, n*n
		y[i] = p.TTFTMs
	}
	return TTFTModel{Coef: leastSquares(cols, y)}
}

// FitTPOT fits tpot_profiling_data [[avg_len, batch_size, ms]] by least
// squares with the plane TPOT = c0 + c1·batch + c2·tokens. A profile
// point's tokens are batch_size × (avg_len − 1), as xllm-service's
// predictor counts them, so profiles written for it mean the same here.
// A profile with a single batch size (or tokens proportional to the
// batch) cannot tell the terms apart; the later term then drops out.
func FitTPOT(points []instance.TPOTPoint) TPOTModel {
	if len(points) == 0 {
		return TPOTModel{}
	}
	cols := [3][]float64{make([]float64, len(points)), make([]float64, len(points)), make([]float64, len(points))}
	y := make([]float64, len(points))
	for i, p := range points {
		b := float64(p.BatchSize)
		cols[0][i], cols[1][i], cols[2][i] = 1, b, b*float64(p.AvgLen-1)
		y[i] = p.TPOTMs
	}
	return TPOTModel{Coef: leastSquares(cols, y)}
}

// dependentTolerance is the relative residual below which a column is
// taken as a combination of the earlier ones and dropped from a fit.
const dependentTolerance = 1e-10

// leastSquares returns the coefficients c minimising ‖Σ c_j·cols[j] − y‖
// by a QR factorisation (modified Gram–Schmidt, orthogonalised twice),
// which stays accurate where the normal equations of a Vandermonde
// matrix would not. Each column is first scaled to a largest magnitude
// of 1, so n² of a 32k-token prompt and the constant column are
// comparable. Columns are taken in order; one that is (numerically) a
// combination of those kept gets coefficient 0, which lowers the degree
// of an underdetermined fit instead of failing it.
func leastSquares(cols [3][]float64, y []float64) [3]float64 {
	m := len(y)
	var scale [3]float64
	var q [3][]float64
	var r [3][3]float64
	var kept [3]bool
	for j := range cols {
		for _, v := range cols[j] {
			scale[j] = math.Max(scale[j], math.Abs(v))
		}
		if scale[j] == 0 || math.IsInf(scale[j], 0) || math.IsNaN(scale[j]) {
			continue
		}
		v := make([]float64, m)
		for i := range v {
			v[i] = cols[j][i] / scale[j]
		}
		norm0 := norm(v)
		for range 2 {
			for k := range j {
				if kept[k] {
					d := dot(q[k], v)
					r[k][j] += d
					axpy(-d, q[k], v)
				}
			}
		}
		n := norm(v)
		if n <= dependentTolerance*norm0 {
			for k := range j {
				r[k][j] = 0
			}
			continue
		}
		for i := range v {
			v[i] /= n
		}
		q[j], r[j][j], kept[j] = v, n, true
	}
	// Solve R·c = Qᵀ·y over the kept columns, back to front.
	var c [3]float64
	for j := len(cols) - 1; j >= 0; j-- {
		if !kept[j] {
			continue
		}
		s := dot(q[j], y)
		for k := j + 1; k < len(cols); k++ {
			if kept[k] {
				s -= r[j][k] * c[k]
			}
		}
		c[j] = s / r[j][j]
	}
	for j := range c {
		if kept[j] {
			c[j] /= scale[j]
		}
	}
	return c
}

func dot(a, b []float64) float64 {
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

func axpy(a float64, x, y []float64) {
	for i := range x {
		y[i] += a * x[i]
	}
}

func norm(v []float64) float64 { return math.Sqrt(dot(v, v)) }
