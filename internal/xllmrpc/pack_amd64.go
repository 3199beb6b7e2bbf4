//go:build !purego

package xllmrpc

import "golang.org/x/sys/cpu"

// packAVX512 is whether the processor has every instruction packIDs
// uses; set once, from what the processor reports, and never changed.
var packAVX512 = cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VBMI2 && cpu.X86.HasPOPCNT

// packIDs writes at dst the varints of the first n ids, n a positive
// multiple of 16, and returns how many bytes they took. dst has room for
// three bytes an id and 64 more. It returns -1, leaving what it wrote
// to be written over, when an id is 2^21 or more, or when the processor
// lacks AVX-512's byte compress (VBMI2).
//
//go:noescape
func packIDs(dst *byte, ids *uint32, n int) int
