//go:build !purego

package kvevent

import "golang.org/x/sys/cpu"

// idsAVX512 is whether the processor has every instruction
// decodeIDsAVX512 uses; set once, from what the processor reports, and
// never changed.
var idsAVX512 = cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VBMI &&
	cpu.X86.HasBMI2 && cpu.X86.HasPOPCNT

// decodeIDs reads ids of dst from p, whose first byte starts one, 64
// bytes at a time while 128 remain, and returns how many it read and
// the offset after them; it stops before a window in which an id would
// start at a byte that is no id's type byte, and reads none where the
// processor lacks AVX-512 VBMI.
func decodeIDs(p []byte, dst []uint32) (ids, used int) {
	if !idsAVX512 || len(p) < 128 || len(dst) == 0 {
		return 0, 0
	}
	return decodeIDsAVX512(&p[0], len(p), &dst[0], len(dst))
}

//go:noescape
func decodeIDsAVX512(p *byte, n int, dst *uint32, k int) (ids, used int)
