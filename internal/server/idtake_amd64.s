//go:build !purego

#include "textflag.h"

DATA idtIota<>+0(SB)/8, $0x0706050403020100
DATA idtIota<>+8(SB)/8, $0x0f0e0d0c0b0a0908
DATA idtIota<>+16(SB)/8, $0x1716151413121110
DATA idtIota<>+24(SB)/8, $0x1f1e1d1c1b1a1918
DATA idtIota<>+32(SB)/8, $0x2726252423222120
DATA idtIota<>+40(SB)/8, $0x2f2e2d2c2b2a2928
DATA idtIota<>+48(SB)/8, $0x3736353433323130
DATA idtIota<>+56(SB)/8, $0x3f3e3d3c3b3a3938
GLOBL idtIota<>(SB), RODATA|NOPTR, $64

// idtLane holds, in each of the eight bytes of lane i, i: the lane's
// id among the eight taken at a time.
DATA idtLane<>+0(SB)/8, $0x0000000000000000
DATA idtLane<>+8(SB)/8, $0x0101010101010101
DATA idtLane<>+16(SB)/8, $0x0202020202020202
DATA idtLane<>+24(SB)/8, $0x0303030303030303
DATA idtLane<>+32(SB)/8, $0x0404040404040404
DATA idtLane<>+40(SB)/8, $0x0505050505050505
DATA idtLane<>+48(SB)/8, $0x0606060606060606
DATA idtLane<>+56(SB)/8, $0x0707070707070707
GLOBL idtLane<>(SB), RODATA|NOPTR, $64

DATA idtZeros<>+0(SB)/8, $0x3030303030303030
GLOBL idtZeros<>(SB), RODATA|NOPTR, $8
DATA idtOnes<>+0(SB)/8, $0x0101010101010101
GLOBL idtOnes<>(SB), RODATA|NOPTR, $8
DATA idtEights<>+0(SB)/8, $0x0808080808080808
GLOBL idtEights<>(SB), RODATA|NOPTR, $8
DATA idtPos<>+0(SB)/8, $0x0706050403020100
GLOBL idtPos<>(SB), RODATA|NOPTR, $8
DATA idtTens<>+0(SB)/8, $0x010a010a010a010a
GLOBL idtTens<>(SB), RODATA|NOPTR, $8
DATA idtHundreds<>+0(SB)/8, $0x0001006400010064
GLOBL idtHundreds<>(SB), RODATA|NOPTR, $8
DATA idtTenThousands<>+0(SB)/8, $0x0001271000012710
GLOBL idtTenThousands<>(SB), RODATA|NOPTR, $8

// func takeIDs(p *byte, starts, ends uint64, dst *uint32) int
//
// Without the instructions (idsAVX512 false) it takes nothing: -1.
// The digits of the ids (the bytes from each start up to its end) are
// packed together; the positions of each id's first and last digit
// among them, packed likewise, give its start and length there. Eight
// ids at a time, each id's digits go to a lane of eight bytes of its
// own, ending at the lane's end (so that the lane reads as eight digits
// with leading zeros), and three multiply-adds make the lanes values.
TEXT ·takeIDs(SB), NOSPLIT|NOFRAME, $0-40
	CMPB	·idsAVX512(SB), $0
	JEQ	none
	MOVQ	p+0(FP), SI
	MOVQ	starts+8(FP), AX
	MOVQ	ends+16(FP), BX
	MOVQ	dst+24(FP), DI
	// Only the starts below the last end.
	BSRQ	BX, CX
	BZHIQ	CX, AX, AX
	// The ids' digits: each end less its start sets the bits between.
	MOVQ	BX, CX
	SUBQ	AX, CX
	MOVQ	BX, R8
	SHRQ	$1, R8
	PEXTQ	CX, AX, R9
	PEXTQ	CX, R8, R10
	POPCNTQ	BX, R11
	KMOVQ	CX, K1
	KMOVQ	R9, K2
	KMOVQ	R10, K3
	VMOVDQU8	(SI), Z0
	VPBROADCASTQ	idtZeros<>(SB), Z16
	VPSUBB	Z16, Z0, Z0
	VPCOMPRESSB.Z	Z0, K1, Z2
	VMOVDQU64	idtIota<>(SB), Z17
	VPCOMPRESSB.Z	Z17, K2, Z3
	VPCOMPRESSB.Z	Z17, K3, Z4
	// Lengths: last less first plus one (1 past the n ids, both 0).
	VPSUBB	Z3, Z4, Z4
	VPBROADCASTQ	idtOnes<>(SB), Z18
	VPADDB	Z18, Z4, Z4
	VPBROADCASTQ	idtEights<>(SB), Z6
	VPCMPUB	$6, Z6, Z4, K4
	KORTESTQ	K4, K4
	JNZ	long
	VMOVDQU64	idtLane<>(SB), Z5
	VPBROADCASTQ	idtPos<>(SB), Z9
	VPBROADCASTQ	idtTens<>(SB), Z19
	VPBROADCASTQ	idtHundreds<>(SB), Z20
	VPBROADCASTQ	idtTenThousands<>(SB), Y21
	MOVQ	R11, ret+32(FP)
	MOVQ	R11, R12
loop:
	VPERMB	Z3, Z5, Z7
	VPERMB	Z4, Z5, Z8
	VPADDB	Z9, Z7, Z7
	VPCMPUB	$1, Z8, Z9, K5
	VPERMB.Z	Z2, Z7, K5, Z10
	// Shift each lane's digits up by 8 - length bytes.
	VPSUBB	Z8, Z6, Z11
	VPSRLQ	$56, Z11, Z11
	VPSLLQ	$3, Z11, Z11
	VPSLLVQ	Z11, Z10, Z10
	VPMADDUBSW	Z19, Z10, Z10
	VPMADDWD	Z20, Z10, Z10
	VPMOVDW	Z10, Y10
	VPMADDWD	Y21, Y10, Y10
	// Store the lanes of the ids left, eight at most.
	MOVL	$0xff, R13
	BZHIQ	R12, R13, R13
	KMOVQ	R13, K6
	VMOVDQU32	Y10, K6, (DI)
	ADDQ	$32, DI
	VPADDB	Z6, Z5, Z5
	SUBQ	$8, R12
	JG	loop
	VZEROUPPER
	RET
long:
	MOVQ	$-1, ret+32(FP)
	VZEROUPPER
	RET
none:
	MOVQ	$-1, ret+32(FP)
	RET

// func classifyIDsAsm(m *idClasses, p *byte)
TEXT ·classifyIDsAsm(SB), NOSPLIT|NOFRAME, $0-16
	CMPB	·idsAVX512(SB), $0
	JEQ	sse2
	JMP	·classifyIDsAVX512(SB)
sse2:
	JMP	·classifyIDsSSE2(SB)

DATA idtClose<>+0(SB)/8, $0x5d5d5d5d5d5d5d5d
GLOBL idtClose<>(SB), RODATA|NOPTR, $8
DATA idtComma<>+0(SB)/8, $0x2c2c2c2c2c2c2c2c
GLOBL idtComma<>(SB), RODATA|NOPTR, $8
DATA idtSpace<>+0(SB)/8, $0x2020202020202020
GLOBL idtSpace<>(SB), RODATA|NOPTR, $8
DATA idtNines<>+0(SB)/8, $0x0909090909090909
GLOBL idtNines<>(SB), RODATA|NOPTR, $8

// func classifyIDsAVX512(m *idClasses, p *byte)
TEXT ·classifyIDsAVX512(SB), NOSPLIT|NOFRAME, $0-16
	MOVQ	m+0(FP), DI
	MOVQ	p+8(FP), SI
	VMOVDQU8	(SI), Z0
	VPBROADCASTQ	idtZeros<>(SB), Z16
	VPBROADCASTQ	idtNines<>(SB), Z17
	VPBROADCASTQ	idtComma<>(SB), Z18
	VPBROADCASTQ	idtSpace<>(SB), Z19
	VPBROADCASTQ	idtClose<>(SB), Z20
	VPSUBB	Z16, Z0, Z1
	VPCMPUB	$2, Z17, Z1, K1
	VPCMPEQB	Z16, Z0, K2
	VPCMPEQB	Z18, Z0, K3
	VPCMPEQB	Z19, Z0, K4
	VPCMPEQB	Z20, Z0, K5
	KMOVQ	K1, 0(DI)
	KMOVQ	K2, 8(DI)
	KMOVQ	K3, 16(DI)
	KMOVQ	K4, 24(DI)
	KMOVQ	K5, 32(DI)
	VZEROUPPER
	RET
