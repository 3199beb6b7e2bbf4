//go:build !purego

package server

import "golang.org/x/sys/cpu"

// idsAVX512 is whether the processor has every instruction takeIDs and
// classifyIDsAVX512 use; set once, from what the processor reports, and
// never changed.
var idsAVX512 = cpu.X86.HasAVX512VBMI2 && cpu.X86.HasAVX512VBMI && cpu.X86.HasAVX512BW &&
	cpu.X86.HasAVX512VL && cpu.X86.HasBMI2 && cpu.X86.HasPOPCNT

// takeIDs writes to dst the values of the ids in the 64 bytes at p that
// end at a bit of ends (the byte after the id's last digit), each
// starting at the bit of starts before its end, and returns how many it
// wrote. idRun has found them to be plain ids of decimal digits; ends is
// not 0; starts past the last end are left out; dst has room for 32.
// It returns -1, writing nothing, when it cannot take them all at once:
// an id of more than eight digits, or a processor without AVX-512's byte
// compress and permute (VBMI, VBMI2). idRun then takes them one by one.
//
//go:noescape
func takeIDs(p *byte, starts, ends uint64, dst *uint32) int
