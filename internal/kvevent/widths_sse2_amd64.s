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

// STEP adds to ACC the lanes of the widths WC, shifted down by S bytes
// (the next sixteen, WN, filling in), where WC's own lane is S: the
// width of the id after the one whose width it is. Lanes equal to S in
// EQ select them; T1 and T2 are clobbered.
#define STEP(S, CS, WC, WN, ACC, T1, T2) \
	MOVO	WC, T1 \
	PSRLDQ	$S, T1 \
	MOVO	WN, T2 \
	PSLLDQ	$(16-S), T2 \
	POR	T2, T1 \
	MOVO	WC, T2 \
	PCMPEQB	CS, T2 \
	PAND	T2, T1 \
	PADDB	T1, ACC

// func fillWindow2SSE2(ws, ws2 *byte, p *byte, n int)
//
// ws gets the widths of p's first n bytes, as idWidths; ws2 the sum of
// a byte's width and the width of the byte that many bytes on, where
// that is 1, 2, 3 or 5 (the sizes of the ids): the distance to the id
// after next. p holds n+16 bytes; n is a positive multiple of 16.
TEXT ·fillWindow2SSE2(SB), NOSPLIT|NOFRAME, $0-32
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
	MOVQ	$0x0202020202020202, AX
	MOVQ	AX, X10
	PUNPCKLQDQ	X10, X10
	MOVQ	$0x0505050505050505, AX
	MOVQ	AX, X11
	PUNPCKLQDQ	X11, X11
	WIDTHS((SI), X0, X4, X5)

loop:
	WIDTHS(16(SI), X1, X4, X5)
	MOVO	X0, X2
	STEP(1, X8, X0, X1, X2, X4, X5)
	STEP(2, X10, X0, X1, X2, X4, X5)
	STEP(3, X9, X0, X1, X2, X4, X5)
	STEP(5, X11, X0, X1, X2, X4, X5)
	MOVOU	X0, (DI)
	MOVOU	X2, (DX)
	MOVO	X1, X0
	ADDQ	$16, SI
	ADDQ	$16, DI
	ADDQ	$16, DX
	SUBQ	$16, CX
	JNZ	loop
	RET
