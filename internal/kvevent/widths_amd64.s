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

// func fillWindowSSSE3(ws, ws2 *byte, p *byte, n int)
//
// ws gets the widths of p's first n bytes, as idWidths, with
// notIDFlags' flags; ws2 each byte's width plus the width of the byte
// that many bytes on: the distance to the id after next. PSHUFB (SSSE3) picks that byte's width from this
// block of sixteen widths or the next. p holds n+16 bytes; n is a
// positive multiple of 16.
TEXT ·fillWindowSSSE3(SB), NOSPLIT|NOFRAME, $0-32
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

// func fillWindowAVX2(ws, ws2 *byte, p *byte, n int)
//
// fillWindowSSSE3 thirty-two bytes at a time: each 16-byte half does
// what fillWindowSSSE3 does with sixteen, the half after it taken from
// this block and the next (VPERM2I128). p holds n+32 bytes; n is a
// positive multiple of 32.
TEXT ·fillWindowAVX2(SB), NOSPLIT|NOFRAME, $0-32
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
