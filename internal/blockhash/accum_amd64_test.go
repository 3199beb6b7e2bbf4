//go:build !purego

package blockhash

// accumulators are the vector accumulates this processor can run.
func accumulators() map[string]func(*[8]uint64, []byte, []byte, int) {
	m := map[string]func(*[8]uint64, []byte, []byte, int){}
	if accAVX2 {
		m["avx2"] = func(acc *[8]uint64, p, s []byte, n int) { accumAVX2(acc, &p[0], &s[0], n) }
	}
	return m
}
