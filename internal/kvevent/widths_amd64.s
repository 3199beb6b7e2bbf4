//go:build !purego

#include "textflag.h"

// WIDTHS sets X to the widths of the sixteen bytes at (R): 2 + t + t>>1,
// t the low two bits, for bytes of 0x80 and above, 1 for the others.
// It clobbers T1 and T2. X8 holds 0x01 and X9 0x03 in every byte.
#define WIDTHS(R, X, T1, T2) \
	MOVOU	R, X \
	PXOR	T1, T1 \
	PCMPGTB	X, T1 \
	PAND	X9, X \
	MOVO	X, T2 \
	PSRLW	$1, T2 \
	PAND	X8, T2 \
	PADDB	X8, X \
	PADDB	T2, X \
	PAND	T1, X \
	PADDB	X8, X

// func fillPairsSSSE3(ws, ws2 *byte, p *byte, n int)
//
// ws gets the widths of p's first n bytes, as idWidths, with
// notIDFlags' flags; ws2 each byte's width plus the width of the byte
// that many bytes on: the distance to the id after next. PSHUFB (SSSE3) picks that byte's width from this
// block of sixteen widths or the next. p holds n+16 bytes; n is a
// positive multiple of 16.
TEXT ·fillPairsSSSE3(SB), NOSPLIT|NOFRAME, $0-32
	MOVQ	ws+0(FP), DI
	MOVQ	ws2+8(FP), DX
	MOVQ	p+16(FP), SI
	MOVQ	n+24(FP), CX
	MOVQ	$0x0101010101010101, AX
	MOVQ	AX, X8
	PUNPCKLQDQ	X8, X8
	MOVQ	$0x0303030303030303, AX
	MOVQ	AX, X9
	PUNPCKLQDQ	X9, X9
	// X12: each lane's index; X13: 15 and X14: 16 in every byte.
	MOVQ	$0x0706050403020100, AX
	MOVQ	AX, X12
	MOVQ	$0x0f0e0d0c0b0a0908, AX
	MOVQ	AX, X6
	PUNPCKLQDQ	X6, X12
	MOVQ	$0x0f0f0f0f0f0f0f0f, AX
	MOVQ	AX, X13
	PUNPCKLQDQ	X13, X13
	MOVQ	$0x1010101010101010, AX
	MOVQ	AX, X14
	PUNPCKLQDQ	X14, X14
	// X10: 0xcc, X11: 0x7f, X6: 0x7d, X7: 0x80 in every byte, for the
	// flags of bytes that are no id's type byte (notIDFlags).
	MOVQ	$0xcccccccccccccccc, AX
	MOVQ	AX, X10
	PUNPCKLQDQ	X10, X10
	MOVQ	$0x7f7f7f7f7f7f7f7f, AX
	MOVQ	AX, X11
	PUNPCKLQDQ	X11, X11
	MOVQ	$0x7d7d7d7d7d7d7d7d, AX
	MOVQ	AX, X6
	PUNPCKLQDQ	X6, X6
	MOVQ	$0x8080808080808080, AX
	MOVQ	AX, X7
	PUNPCKLQDQ	X7, X7
	WIDTHS((SI), X0, X4, X5)

loop:
	WIDTHS(16(SI), X1, X4, X5)
	// X2 = lane + width, 1 to 21: the byte whose width is wanted, in
	// this block (X0) below 16, in the next (X1) from 16. PSHUFB gives
	// zero for an index with its top bit set: X3 is X2 with the lanes
	// of 16 and above all ones, X2-16 is negative below 16.
	MOVO	X0, X2
	PADDB	X12, X2
	MOVO	X2, X3
	PCMPGTB	X13, X3
	POR	X2, X3
	MOVO	X0, X4
	PSHUFB	X3, X4
	PSUBB	X14, X2
	MOVO	X1, X5
	PSHUFB	X2, X5
	POR	X5, X4
	PADDB	X0, X4
	MOVOU	X4, (DX)
	// ws gets the widths with notID set in the lanes of bytes that are
	// no id's type byte: v = byte^0xcc is below 3 only for 0xcc to 0xce.
	MOVOU	(SI), X3
	MOVO	X3, X5
	PXOR	X10, X5
	MOVO	X5, X4
	PAND	X11, X4
	PADDB	X6, X4
	POR	X5, X4
	PAND	X3, X4
	PAND	X7, X4
	POR	X0, X4
	MOVOU	X4, (DI)
	MOVO	X1, X0
	ADDQ	$16, SI
	ADDQ	$16, DI
	ADDQ	$16, DX
	SUBQ	$16, CX
	JNZ	loop
	RET


// WIDTHS32 is WIDTHS for the thirty-two bytes at (R), in Y, with Y8 and
// Y9 holding 0x01 and 0x03 in every byte.
#define WIDTHS32(R, Y, T1, T2) \
	VMOVDQU	R, Y \
	VPXOR	T1, T1, T1 \
	VPCMPGTB	Y, T1, T1 \
	VPAND	Y9, Y, Y \
	VPSRLW	$1, Y, T2 \
	VPAND	Y8, T2, T2 \
	VPADDB	Y8, Y, Y \
	VPADDB	T2, Y, Y \
	VPAND	T1, Y, Y \
	VPADDB	Y8, Y, Y

// func fillPairsAVX2(ws, ws2 *byte, p *byte, n int)
//
// fillPairsSSSE3 thirty-two bytes at a time: each 16-byte half does
// what fillPairsSSSE3 does with sixteen, the half after it taken from
// this block and the next (VPERM2I128). p holds n+32 bytes; n is a
// positive multiple of 32.
TEXT ·fillPairsAVX2(SB), NOSPLIT|NOFRAME, $0-32
	MOVQ	ws+0(FP), DI
	MOVQ	ws2+8(FP), DX
	MOVQ	p+16(FP), SI
	MOVQ	n+24(FP), CX
	MOVQ	$0x0101010101010101, AX
	MOVQ	AX, X8
	VPBROADCASTQ	X8, Y8
	MOVQ	$0x0303030303030303, AX
	MOVQ	AX, X9
	VPBROADCASTQ	X9, Y9
	MOVQ	$0xcccccccccccccccc, AX
	MOVQ	AX, X10
	VPBROADCASTQ	X10, Y10
	MOVQ	$0x7f7f7f7f7f7f7f7f, AX
	MOVQ	AX, X11
	VPBROADCASTQ	X11, Y11
	MOVQ	$0x7d7d7d7d7d7d7d7d, AX
	MOVQ	AX, X6
	VPBROADCASTQ	X6, Y6
	MOVQ	$0x8080808080808080, AX
	MOVQ	AX, X7
	VPBROADCASTQ	X7, Y7
	// Y12: each byte's index in its half; Y13: 15 and Y14: 16 in every
	// byte.
	MOVQ	$0x0706050403020100, AX
	MOVQ	AX, X12
	MOVQ	$0x0f0e0d0c0b0a0908, AX
	MOVQ	AX, X13
	PUNPCKLQDQ	X13, X12
	VINSERTI128	$1, X12, Y12, Y12
	MOVQ	$0x0f0f0f0f0f0f0f0f, AX
	MOVQ	AX, X13
	VPBROADCASTQ	X13, Y13
	MOVQ	$0x1010101010101010, AX
	MOVQ	AX, X14
	VPBROADCASTQ	X14, Y14
	WIDTHS32((SI), Y0, Y3, Y4)

loop32:
	WIDTHS32(32(SI), Y1, Y3, Y4)
	// Y2: the widths of the sixteen bytes after each half.
	VPERM2I128	$0x21, Y1, Y0, Y2
	VPADDB	Y12, Y0, Y3
	VPCMPGTB	Y13, Y3, Y4
	VPOR	Y3, Y4, Y4
	VPSHUFB	Y4, Y0, Y5
	VPSUBB	Y14, Y3, Y3
	VPSHUFB	Y3, Y2, Y2
	VPOR	Y2, Y5, Y5
	VPADDB	Y0, Y5, Y5
	VMOVDQU	Y5, (DX)
	VMOVDQU	(SI), Y3
	VPXOR	Y10, Y3, Y4
	VPAND	Y11, Y4, Y5
	VPADDB	Y6, Y5, Y5
	VPOR	Y4, Y5, Y5
	VPAND	Y3, Y5, Y5
	VPAND	Y7, Y5, Y5
	VPOR	Y0, Y5, Y5
	VMOVDQU	Y5, (DI)
	VMOVDQA	Y1, Y0
	ADDQ	$32, SI
	ADDQ	$32, DI
	ADDQ	$32, DX
	SUBQ	$32, CX
	JNZ	loop32
	VZEROUPPER
	RET

// func fillQuadsSSSE3(w2, w4 *byte, n int)
//
// w4 gets each byte's w2 plus the w2 of the byte that many bytes on, for
// n bytes, n a positive multiple of 16, sixteen at a time: PSHUFB picks
// it from this block of sixteen or the next, as fillPairsSSSE3 picks a
// width. A w2 is at most 12, so the byte picked lies at most 27 bytes
// on; w2 holds n+16 bytes.
TEXT ·fillQuadsSSSE3(SB), NOSPLIT|NOFRAME, $0-24
	MOVQ	w2+0(FP), SI
	MOVQ	w4+8(FP), DI
	MOVQ	n+16(FP), CX
	// X12: each lane's index; X13: 15 and X14: 16 in every byte.
	MOVQ	$0x0706050403020100, AX
	MOVQ	AX, X12
	MOVQ	$0x0f0e0d0c0b0a0908, AX
	MOVQ	AX, X6
	PUNPCKLQDQ	X6, X12
	MOVQ	$0x0f0f0f0f0f0f0f0f, AX
	MOVQ	AX, X13
	PUNPCKLQDQ	X13, X13
	MOVQ	$0x1010101010101010, AX
	MOVQ	AX, X14
	PUNPCKLQDQ	X14, X14

quads16:
	MOVOU	(SI), X0
	MOVOU	16(SI), X1
	MOVO	X0, X2
	PADDB	X12, X2
	MOVO	X2, X3
	PCMPGTB	X13, X3
	POR	X2, X3
	MOVO	X0, X4
	PSHUFB	X3, X4
	PSUBB	X14, X2
	PSHUFB	X2, X1
	POR	X1, X4
	PADDB	X0, X4
	MOVOU	X4, (DI)
	ADDQ	$16, SI
	ADDQ	$16, DI
	SUBQ	$16, CX
	JNZ	quads16
	RET

// func fillQuadsAVX2(w2, w4 *byte, n int)
//
// fillQuadsSSSE3 thirty-two bytes at a time, n a positive multiple of
// 32: each 16-byte half takes the sixteen bytes after it from one load
// sixteen bytes on.
TEXT ·fillQuadsAVX2(SB), NOSPLIT|NOFRAME, $0-24
	MOVQ	w2+0(FP), SI
	MOVQ	w4+8(FP), DI
	MOVQ	n+16(FP), CX
	MOVQ	$0x0706050403020100, AX
	MOVQ	AX, X12
	MOVQ	$0x0f0e0d0c0b0a0908, AX
	MOVQ	AX, X13
	PUNPCKLQDQ	X13, X12
	VINSERTI128	$1, X12, Y12, Y12
	MOVQ	$0x0f0f0f0f0f0f0f0f, AX
	MOVQ	AX, X13
	VPBROADCASTQ	X13, Y13
	MOVQ	$0x1010101010101010, AX
	MOVQ	AX, X14
	VPBROADCASTQ	X14, Y14

quads32:
	VMOVDQU	(SI), Y0
	VMOVDQU	16(SI), Y1
	VPADDB	Y12, Y0, Y2
	VPCMPGTB	Y13, Y2, Y3
	VPOR	Y2, Y3, Y3
	VPSHUFB	Y3, Y0, Y4
	VPSUBB	Y14, Y2, Y2
	VPSHUFB	Y2, Y1, Y1
	VPOR	Y1, Y4, Y4
	VPADDB	Y0, Y4, Y4
	VMOVDQU	Y4, (DI)
	ADDQ	$32, SI
	ADDQ	$32, DI
	SUBQ	$32, CX
	JNZ	quads32
	VZEROUPPER
	RET

// walkMasks keeps the value bytes of an id of each width (idMasks).
DATA walkMasks<>+0(SB)/4, $0
DATA walkMasks<>+4(SB)/4, $0xff
DATA walkMasks<>+8(SB)/4, $0xff
DATA walkMasks<>+12(SB)/4, $0xffff
DATA walkMasks<>+16(SB)/4, $0
DATA walkMasks<>+20(SB)/4, $0xffffffff
DATA walkMasks<>+24(SB)/4, $0
DATA walkMasks<>+28(SB)/4, $0
GLOBL walkMasks<>(SB), RODATA|NOPTR, $32

// func walkQuadsAMD64(w, q *byte, dst *uint32, quads int, j uint) (n int, pos uint)
//
// walkQuadsGo's walk of at most quads steps from j < 480 (walkStride),
// quads > 0. w is a window's w; its w2 follows 528 bytes on and its w4
// 1056 bytes on (idChunk+16 each).
TEXT ·walkQuadsAMD64(SB), NOSPLIT|NOFRAME, $0-56
	MOVQ	w+0(FP), DI
	MOVQ	q+8(FP), SI
	MOVQ	dst+16(FP), R8
	MOVQ	j+32(FP), BX
	LEAQ	walkMasks<>(SB), DX

quad:
	// AX, R12, R13, R15: the widths of the four ids; R11, R9, R14: where
	// the second, third and fourth start; R10: where the step ends.
	// Only R10 is on the chain from one step to the next.
	MOVBQZX	(DI)(BX*1), AX
	MOVBQZX	528(DI)(BX*1), R9
	MOVBQZX	1056(DI)(BX*1), R10
	MOVL	AX, R11
	ANDL	$7, R11
	ADDQ	BX, R11
	ADDQ	BX, R9
	ADDQ	BX, R10
	MOVBQZX	(DI)(R11*1), R12
	MOVBQZX	(DI)(R9*1), R13
	MOVL	R13, R14
	ANDL	$7, R14
	ADDQ	R9, R14
	MOVBQZX	(DI)(R14*1), R15
	MOVL	AX, CX
	ORL	R12, CX
	ORL	R13, CX
	ORL	R15, CX
	TESTL	$0x80, CX
	JNZ	quadsDone
	// No flag: every width is 1, 2, 3 or 5.
	MOVQ	(SI)(R11*1), CX
	BSWAPQ	CX
	ANDL	(DX)(AX*4), CX
	MOVL	CX, (R8)
	MOVQ	(SI)(R9*1), CX
	BSWAPQ	CX
	ANDL	(DX)(R12*4), CX
	MOVL	CX, 4(R8)
	MOVQ	(SI)(R14*1), CX
	BSWAPQ	CX
	ANDL	(DX)(R13*4), CX
	MOVL	CX, 8(R8)
	MOVQ	(SI)(R10*1), CX
	BSWAPQ	CX
	ANDL	(DX)(R15*4), CX
	MOVL	CX, 12(R8)
	ADDQ	$16, R8
	MOVQ	R10, BX
	DECQ	quads+24(FP)
	JZ	quadsDone
	CMPQ	BX, $480
	JB	quad

quadsDone:
	MOVQ	R8, AX
	SUBQ	dst+16(FP), AX
	SHRQ	$2, AX
	MOVQ	AX, n+40(FP)
	MOVQ	BX, pos+48(FP)
	RET
