//go:build !amd64 || purego

package blockhash

func accumulate(acc *[8]uint64, p, secret []byte, n int) { accumulateGeneric(acc, p, secret, n) }

func (h *Hasher) longAfter(bool, uint64, uint64, []byte) (hi, lo uint64, ok bool) { return 0, 0, false }
