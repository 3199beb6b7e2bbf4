//go:build !purego

package xllmrpc

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// packIDs itself, where the processor has AVX-512 VBMI2: the
// appendPackedIDs test would pass as well if it packed nothing, since the
// ids would then be written one by one.
func TestPackIDsWritesSixteenAtATime(t *testing.T) {
	if !packAVX512 {
		t.Skip("no AVX-512 VBMI2 on this processor")
	}
	ids := []uint32{0, 1, 127, 128, 16383, 16384, 1<<21 - 1, 5, 151935, 300, 7, 99999, 2, 3, 4, 65535,
		1 << 20, 0, 128, 127, 16384, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}
	var want []byte
	for _, id := range ids {
		want = protowire.AppendVarint(want, uint64(id))
	}
	dst := make([]byte, 3*len(ids)+64)
	if n := packIDs(&dst[0], &ids[0], len(ids)); n != len(want) || !bytes.Equal(dst[:n], want) {
		t.Fatalf("packIDs wrote %d bytes %x, want %x", n, dst[:max(n, 0)], want)
	}
	ids[20] = 1 << 21
	if n := packIDs(&dst[0], &ids[0], len(ids)); n != -1 {
		t.Fatalf("packIDs took an id of 2^21: %d", n)
	}
}
