//go:build !purego

#include "textflag.h"

// func fillWindowSSE2(ws *byte, p *byte, n int)
//
// The same arithmetic as idWidths, sixteen bytes at a time: a byte of
// 0x80 and above (signed, below zero) gets 2 + t + t>>1 with t its low
// two bits, any other byte 1. n is a positive multiple of 16.
TEXT ·fillWindowSSE2(SB), NOSPLIT|NOFRAME, $0-24
	MOVQ	ws+0(FP), DI
	MOVQ	p+8(FP), SI
	MOVQ	n+16(FP), CX
	MOVQ	$0x0101010101010101, AX
	MOVQ	AX, X8
	PUNPCKLQDQ	X8, X8
	MOVQ	$0x0303030303030303, AX
	MOVQ	AX, X9
	PUNPCKLQDQ	X9, X9

loop:
	MOVOU	(SI), X0
	PXOR	X1, X1
	PCMPGTB	X0, X1
	PAND	X9, X0
	MOVO	X0, X2
	PSRLW	$1, X2
	PAND	X8, X2
	PADDB	X8, X0
	PADDB	X2, X0
	PAND	X1, X0
	PADDB	X8, X0
	MOVOU	X0, (DI)
	ADDQ	$16, SI
	ADDQ	$16, DI
	SUBQ	$16, CX
	JNZ	loop
	RET
