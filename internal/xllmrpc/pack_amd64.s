//go:build !purego

#include "textflag.h"

DATA packLow<>+0(SB)/4, $0x0000007f
GLOBL packLow<>(SB), RODATA|NOPTR, $4
DATA packMid<>+0(SB)/4, $0x00007f00
GLOBL packMid<>(SB), RODATA|NOPTR, $4
DATA packHigh<>+0(SB)/4, $0x007f0000
GLOBL packHigh<>(SB), RODATA|NOPTR, $4
DATA packMore1<>+0(SB)/4, $0x00000080
GLOBL packMore1<>(SB), RODATA|NOPTR, $4
DATA packTwo<>+0(SB)/4, $0x00004000
GLOBL packTwo<>(SB), RODATA|NOPTR, $4
DATA packMore2<>+0(SB)/4, $0x00008000
GLOBL packMore2<>(SB), RODATA|NOPTR, $4
DATA packWide<>+0(SB)/4, $0x00200000
GLOBL packWide<>(SB), RODATA|NOPTR, $4
DATA packKeep0<>+0(SB)/4, $0x000000ff
GLOBL packKeep0<>(SB), RODATA|NOPTR, $4
DATA packKeep1<>+0(SB)/4, $0x0000ff00
GLOBL packKeep1<>(SB), RODATA|NOPTR, $4
DATA packKeep2<>+0(SB)/4, $0x00ff0000
GLOBL packKeep2<>(SB), RODATA|NOPTR, $4

// func packIDs(dst *byte, ids *uint32, n int) int
//
// Sixteen ids at a time: each id's three 7-bit groups go to the low
// three bytes of its own lane, the first two with their continuation
// bit where a next group follows, and one byte compress keeps each id's
// bytes up to its last. Every store writes 64 bytes.
TEXT ·packIDs(SB), NOSPLIT|NOFRAME, $0-32
	CMPB	·packAVX512(SB), $0
	JEQ	none
	MOVQ	dst+0(FP), DI
	MOVQ	ids+8(FP), SI
	MOVQ	n+16(FP), CX
	MOVQ	DI, R8
	VPBROADCASTD	packLow<>(SB), Z16
	VPBROADCASTD	packMid<>(SB), Z17
	VPBROADCASTD	packHigh<>(SB), Z18
	VPBROADCASTD	packMore1<>(SB), Z19
	VPBROADCASTD	packTwo<>(SB), Z20
	VPBROADCASTD	packMore2<>(SB), Z21
	VPBROADCASTD	packWide<>(SB), Z22
	VPBROADCASTD	packKeep0<>(SB), Z23
	VPBROADCASTD	packKeep1<>(SB), Z24
	VPBROADCASTD	packKeep2<>(SB), Z25
loop:
	VMOVDQU32	(SI), Z0
	VPCMPUD	$5, Z22, Z0, K4
	KORTESTW	K4, K4
	JNZ	wide
	VPANDD	Z16, Z0, Z1
	VPSLLD	$1, Z0, Z2
	VPANDD	Z17, Z2, Z2
	VPORD	Z2, Z1, Z1
	VPSLLD	$2, Z0, Z3
	VPANDD	Z18, Z3, Z3
	VPORD	Z3, Z1, Z1
	// K1: a second byte (2^7 on); K2: a third (2^14 on).
	VPCMPUD	$5, Z19, Z0, K1
	VPCMPUD	$5, Z20, Z0, K2
	VPORD	Z19, Z1, K1, Z1
	VPORD	Z21, Z1, K2, Z1
	VMOVDQA32	Z23, Z4
	VPORD	Z24, Z4, K1, Z4
	VPORD	Z25, Z4, K2, Z4
	VPTESTMB	Z4, Z4, K3
	VPCOMPRESSB.Z	Z1, K3, Z5
	VMOVDQU8	Z5, (DI)
	KMOVQ	K3, AX
	POPCNTQ	AX, AX
	ADDQ	AX, DI
	ADDQ	$64, SI
	SUBQ	$16, CX
	JG	loop
	SUBQ	R8, DI
	MOVQ	DI, ret+24(FP)
	VZEROUPPER
	RET
wide:
	VZEROUPPER
none:
	MOVQ	$-1, ret+24(FP)
	RET
