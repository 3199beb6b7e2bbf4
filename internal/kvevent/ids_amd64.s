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

// vidClass, in each 16-byte lane, maps min(b - 0xcb, 4) for a byte b to
// the width of an id whose type byte b is, with bit 7 set where b is no
// uint8, uint16 or uint32 type byte (then a fixint's 1, if b is one).
DATA vidClass<>+0(SB)/8, $0x8181818105030281
DATA vidClass<>+8(SB)/8, $0x8181818181818181
DATA vidClass<>+16(SB)/8, $0x8181818105030281
DATA vidClass<>+24(SB)/8, $0x8181818181818181
DATA vidClass<>+32(SB)/8, $0x8181818105030281
DATA vidClass<>+40(SB)/8, $0x8181818181818181
DATA vidClass<>+48(SB)/8, $0x8181818105030281
DATA vidClass<>+56(SB)/8, $0x8181818181818181
GLOBL vidClass<>(SB), RODATA|NOPTR, $64

// VALUES16 sets Z13 to the values of the sixteen ids whose lanes Z11
// selects in Z9, one a four-byte lane: byte j of lane i is byte last - j
// of the id, last being its last byte (Z15), while that lies after its
// type byte, and byte j = 0 whatever its width (a fixint's value is its
// type byte): while start - (last - j) - (j == 0) is negative. It
// clobbers Z12, Z14 and K7.
#define VALUES16 \
	VPERMB	Z9, Z11, Z12 \
	VPERMB	Z15, Z12, Z13 \
	VPSUBB	Z26, Z13, Z13 \
	VPSUBB	Z13, Z12, Z14 \
	VPSUBB	Z23, Z14, Z14 \
	VPMOVB2M	Z14, K7 \
	VPERMI2B.Z	Z1, Z0, K7, Z13

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
//
// The loop is bound by the one port that runs 512-bit permutes and
// compares into masks, so what a window needs besides its permutes is
// done on the others: widths by one in-lane table look-up, the ids taken
// and the bytes to keep by sign bits (VPMOVB2M), not by compares. While
// 64 or more ids remain to be read the groups are stored whole, the
// lanes past the window's ids written over by the next window's or left
// to the caller, whose ids they are: dst[ids:k] may hold anything after
// a call.
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
	MOVL	$0xcb, AX
	VPBROADCASTB	AX, Z18
	MOVL	$4, AX
	VPBROADCASTB	AX, Z19
	VMOVDQU64	vidClass<>(SB), Z20
	MOVL	$1, AX
	VPBROADCASTB	AX, Z21
	MOVL	$0x7f, AX
	VPBROADCASTB	AX, Z22
	// Z23: 1 in the lowest byte of each four-byte lane.
	MOVL	$1, AX
	VPBROADCASTD	AX, Z23
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
	// Z2: widths. Z29: bit 7 set at the bytes that are no type byte,
	// 0x80 and above but none of 0xcc, 0xcd and 0xce.
	VPSUBB	Z18, Z0, Z2
	VPMINUB	Z19, Z2, Z2
	VPSHUFB	Z2, Z20, Z2
	VPANDD	Z0, Z2, Z29
	VPANDD	Z22, Z2, Z2
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
	// Z9: lane k holds N^k(s) while that lies in the window, and some
	// position past the window once N^k(s) does. A step permutes within
	// the window only, a lane already past it reading some position's
	// power there: taking the greater of that and the lane keeps the
	// lane past the window (powers never go back), at half the port
	// time of a permute across the window and what lies past it.
	VMOVDQA64	Z31, Z9
	VPERMB	Z30, Z31, Z31
	VPSUBB	Z25, Z31, Z31
	VPERMB.Z	Z3, Z9, K1, Z10
	VPMAXUB	Z10, Z9, Z9
	VPERMB.Z	Z4, Z9, K2, Z10
	VPMAXUB	Z10, Z9, Z9
	VPERMB.Z	Z5, Z9, K3, Z10
	VPMAXUB	Z10, Z9, Z9
	VPERMB.Z	Z6, Z9, K4, Z10
	VPMAXUB	Z10, Z9, Z9
	VPERMB.Z	Z7, Z9, K5, Z10
	VPMAXUB	Z10, Z9, Z9
	VPERMB.Z	Z8, Z9, K6, Z10
	VPMAXUB	Z10, Z9, Z9
	// Z15: where an id starting at each position ends, less one: its
	// last byte.
	VPSUBB	Z21, Z3, Z15
	// BX: the ids taken, those that start in the window (a lane of Z9
	// below 64 has bit 6 clear, and none exceeds 127), at most CX.
	VPADDB	Z9, Z9, Z10
	VPMOVB2M	Z10, K7
	KMOVQ	K7, AX
	TZCNTQ	AX, BX
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
	// Values, sixteen ids at a time (VALUES16).
	VMOVDQA64	Z27, Z11
	MOVQ	DI, R13
	CMPQ	CX, $64
	JLT	masked
	MOVQ	BX, R12
whole:
	VALUES16
	VMOVDQU32	Z13, (R13)
	VPADDB	Z28, Z11, Z11
	VALUES16
	VMOVDQU32	Z13, 64(R13)
	VPADDB	Z28, Z11, Z11
	ADDQ	$128, R13
	// Two groups whatever the count: the branch is taken by windows of
	// more than 32 ids only, which real text has few of.
	SUBQ	$32, R12
	JGT	whole
	JMP	stored
masked:
	// Fewer than 64 ids to read: each group's lanes past them are not
	// written.
	MOVQ	R11, R12
part:
	VALUES16
	KMOVQ	R12, K7
	VMOVDQU32	Z13, K7, (R13)
	VPADDB	Z28, Z11, Z11
	ADDQ	$64, R13
	SHRQ	$16, R12
	JNZ	part
stored:
	LEAQ	(DI)(BX*4), DI
	SUBQ	BX, CX
	ADDQ	BX, R10
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
	// AX: where the last id taken ends, N of its start, lane BX - 1
	// of Z9.
	LEAQ	-1(BX), AX
	VPBROADCASTB	AX, Z10
	VPERMB	Z9, Z10, Z10
	VPERMB	Z3, Z10, Z10
	VMOVD	X10, AX
	ANDQ	$0xff, AX
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
