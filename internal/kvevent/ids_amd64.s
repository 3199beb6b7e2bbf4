//go:build !purego

#include "textflag.h"

// vidIota holds 0 to 127: its first half gives position p, whose next id
// is at p plus its width; its second half the positions past the window,
// which stay where they are.
DATA vidIota<>+0(SB)/8, $0x0706050403020100
DATA vidIota<>+8(SB)/8, $0x0f0e0d0c0b0a0908
DATA vidIota<>+16(SB)/8, $0x1716151413121110
DATA vidIota<>+24(SB)/8, $0x1f1e1d1c1b1a1918
DATA vidIota<>+32(SB)/8, $0x2726252423222120
DATA vidIota<>+40(SB)/8, $0x2f2e2d2c2b2a2928
DATA vidIota<>+48(SB)/8, $0x3736353433323130
DATA vidIota<>+56(SB)/8, $0x3f3e3d3c3b3a3938
DATA vidIota<>+64(SB)/8, $0x4746454443424140
DATA vidIota<>+72(SB)/8, $0x4f4e4d4c4b4a4948
DATA vidIota<>+80(SB)/8, $0x5756555453525150
DATA vidIota<>+88(SB)/8, $0x5f5e5d5c5b5a5958
DATA vidIota<>+96(SB)/8, $0x6766656463626160
DATA vidIota<>+104(SB)/8, $0x6f6e6d6c6b6a6968
DATA vidIota<>+112(SB)/8, $0x7776757473727170
DATA vidIota<>+120(SB)/8, $0x7f7e7d7c7b7a7978
GLOBL vidIota<>(SB), RODATA|NOPTR, $128

// vidLanes holds each of sixteen four-byte lanes' number in its bytes.
DATA vidLanes<>+0(SB)/8, $0x0101010100000000
DATA vidLanes<>+8(SB)/8, $0x0303030302020202
DATA vidLanes<>+16(SB)/8, $0x0505050504040404
DATA vidLanes<>+24(SB)/8, $0x0707070706060606
DATA vidLanes<>+32(SB)/8, $0x0909090908080808
DATA vidLanes<>+40(SB)/8, $0x0b0b0b0b0a0a0a0a
DATA vidLanes<>+48(SB)/8, $0x0d0d0d0d0c0c0c0c
DATA vidLanes<>+56(SB)/8, $0x0f0f0f0f0e0e0e0e
GLOBL vidLanes<>(SB), RODATA|NOPTR, $64

// func decodeIDsAVX512(p *byte, n int, dst *uint32, k int) (ids, used int)
//
// Windows of 64 bytes at a stride of 64. For each byte, the width an
// id starting there would have (1, 2, 3 or 5; 1 for a byte that is no
// type byte) gives the position of the next id, N(p) = p + width, with
// positions past the window kept where they are. Five squarings give
// N^2, N^4, ... N^32, and six masked permutes then give every lane k
// the start of the window's k-th id, N^k(s), s being where the first
// one starts: the chain of dependent steps is six permutes a window, not
// one step an id. Each id's value bytes, big-endian after its type byte
// (a fixint is its own), are permuted into a four-byte lane of its own,
// lowest first, sixteen ids at a time. A window whose ids need a start
// that is no type byte is left to the caller, and so is everything once
// fewer than 128 bytes remain.
TEXT ·decodeIDsAVX512(SB), NOSPLIT, $0-48
	MOVQ	p+0(FP), DX
	MOVQ	n+8(FP), R8
	MOVQ	dst+16(FP), DI
	MOVQ	k+24(FP), CX
	MOVQ	DX, SI
	XORQ	R10, R10
	// Z31: every lane holds where the window's first id starts.
	VPXORQ	Z31, Z31, Z31
	// K1 to K6: the lanes whose number has bit 0 to 5 set.
	MOVQ	$0xaaaaaaaaaaaaaaaa, AX
	KMOVQ	AX, K1
	MOVQ	$0xcccccccccccccccc, AX
	KMOVQ	AX, K2
	MOVQ	$0xf0f0f0f0f0f0f0f0, AX
	KMOVQ	AX, K3
	MOVQ	$0xff00ff00ff00ff00, AX
	KMOVQ	AX, K4
	MOVQ	$0xffff0000ffff0000, AX
	KMOVQ	AX, K5
	MOVQ	$0xffffffff00000000, AX
	KMOVQ	AX, K6
	VMOVDQU64	vidIota<>(SB), Z16
	VMOVDQU64	vidIota<>+64(SB), Z17
	MOVL	$0xcc, AX
	VPBROADCASTB	AX, Z18
	MOVL	$0xcd, AX
	VPBROADCASTB	AX, Z19
	MOVL	$0xce, AX
	VPBROADCASTB	AX, Z20
	MOVL	$1, AX
	VPBROADCASTB	AX, Z21
	MOVL	$2, AX
	VPBROADCASTB	AX, Z22
	MOVL	$3, AX
	VPBROADCASTB	AX, Z23
	MOVL	$5, AX
	VPBROADCASTB	AX, Z24
	MOVL	$64, AX
	VPBROADCASTB	AX, Z25
	MOVL	$0x03020100, AX
	VPBROADCASTD	AX, Z26
	VMOVDQU64	vidLanes<>(SB), Z27
	MOVL	$16, AX
	VPBROADCASTB	AX, Z28

window:
	CMPQ	R8, $128
	JLT	stopped
	TESTQ	CX, CX
	JLE	stopped
	VMOVDQU8	(SI), Z0
	VMOVDQU8	64(SI), Z1
	// Widths.
	VMOVDQA64	Z21, Z2
	VPCMPEQB	Z18, Z0, K7
	VMOVDQU8	Z22, K7, Z2
	VPCMPEQB	Z19, Z0, K7
	VMOVDQU8	Z23, K7, Z2
	VPCMPEQB	Z20, Z0, K7
	VMOVDQU8	Z24, K7, Z2
	// Z29: 0xff at bytes of 0x80 and above with width 1, no type byte.
	VPMOVB2M	Z0, K7
	KMOVQ	K7, AX
	VPCMPUB	$4, Z21, Z2, K7
	KMOVQ	K7, BX
	NOTQ	BX
	ANDQ	BX, AX
	KMOVQ	AX, K7
	VPMOVM2B	K7, Z29
	// N and its powers: Z3 N, Z4 N^2, Z5 N^4, Z6 N^8, Z7 N^16, Z8 N^32.
	VPADDB	Z2, Z16, Z3
	VMOVDQA64	Z3, Z4
	VPERMI2B	Z17, Z3, Z4
	VMOVDQA64	Z4, Z5
	VPERMI2B	Z17, Z4, Z5
	VMOVDQA64	Z5, Z6
	VPERMI2B	Z17, Z5, Z6
	VMOVDQA64	Z6, Z7
	VPERMI2B	Z17, Z6, Z7
	VMOVDQA64	Z7, Z8
	VPERMI2B	Z17, Z7, Z8
	// N^64 takes every position past the window, where the next
	// window's first id starts (plus 64): that start is one permute and
	// one subtraction after this one's, whatever the rest of the window
	// costs, and stays in Z31, not in memory, whose store forwarding
	// the chain would wait on.
	VMOVDQA64	Z8, Z30
	VPERMI2B	Z17, Z8, Z30
	// Z9: lane k holds N^k(s).
	VMOVDQA64	Z31, Z9
	VPERMB	Z30, Z31, Z31
	VPSUBB	Z25, Z31, Z31
	VPERMI2B	Z17, Z3, K1, Z9
	VPERMI2B	Z17, Z4, K2, Z9
	VPERMI2B	Z17, Z5, K3, Z9
	VPERMI2B	Z17, Z6, K4, Z9
	VPERMI2B	Z17, Z7, K5, Z9
	VPERMI2B	Z17, Z8, K6, Z9
	// BX: the ids taken, those that start in the window, at most CX.
	VPCMPUB	$1, Z25, Z9, K7
	KMOVQ	K7, AX
	POPCNTQ	AX, BX
	CMPQ	BX, CX
	CMOVQGT	CX, BX
	// Any of them starting at no type byte: leave the window.
	VPERMB	Z29, Z9, Z10
	VPMOVB2M	Z10, K7
	KMOVQ	K7, AX
	MOVQ	$-1, R11
	BZHIQ	BX, R11, R11
	TESTQ	R11, AX
	JNZ	notid
	// Values, sixteen ids at a time: byte j of lane i is the id's
	// (start + width - 1 - j)th byte while j < max(width - 1, 1).
	VMOVDQA64	Z27, Z11
	XORQ	R12, R12
	MOVQ	DI, R13
group:
	VPERMB	Z9, Z11, Z12
	VPERMB	Z2, Z12, Z13
	VPADDB	Z13, Z12, Z12
	VPSUBB	Z21, Z12, Z12
	VPSUBB	Z26, Z12, Z12
	VPSUBB	Z21, Z13, Z13
	VPMAXUB	Z21, Z13, Z13
	VPCMPUB	$1, Z13, Z26, K7
	VPERMI2B.Z	Z1, Z0, K7, Z12
	MOVQ	BX, AX
	SUBQ	R12, AX
	MOVL	$0xffff, R11
	BZHIQ	AX, R11, R11
	KMOVQ	R11, K7
	VMOVDQU32	Z12, K7, (R13)
	ADDQ	$64, R13
	VPADDB	Z28, Z11, Z11
	ADDQ	$16, R12
	CMPQ	R12, BX
	JLT	group
	LEAQ	(DI)(BX*4), DI
	SUBQ	BX, CX
	ADDQ	BX, R10
	// AX: where the last id taken ends, lane BX of Z9, or 64 when the
	// window held 64.
	MOVQ	$64, AX
	CMPQ	BX, $64
	JGE	ended
	VPBROADCASTB	BX, Z10
	VPERMB	Z9, Z10, Z10
	VMOVD	X10, AX
	ANDQ	$0xff, AX
ended:
	TESTQ	CX, CX
	JEQ	last
	// Every id starting in the window was taken: the next starts R9
	// into the next window.
	ADDQ	$64, SI
	SUBQ	$64, R8
	JMP	window
notid:
	// Back to where this window's first id starts.
	VMOVD	X9, R9
	ANDQ	$0xff, R9
	JMP	stop
last:
	ADDQ	AX, SI
	SUBQ	DX, SI
	MOVQ	R10, ids+32(FP)
	MOVQ	SI, used+40(FP)
	VZEROUPPER
	RET
stopped:
	// Where the window the loop stopped at starts.
	VMOVD	X31, R9
	ANDQ	$0xff, R9
stop:
	ADDQ	R9, SI
	SUBQ	DX, SI
	MOVQ	R10, ids+32(FP)
	MOVQ	SI, used+40(FP)
	VZEROUPPER
	RET
