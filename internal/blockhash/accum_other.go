//go:build !amd64 || purego

package blockhash

func accumulate(acc *[8]uint64, p, secret []byte, n int) { accumulateGeneric(acc, p, secret, n) }

func stripesAfter(*[8]uint64, bool, uint64, uint64, []byte, *[secretSize]byte) bool { return false }
