//go:build !purego

#include "textflag.h"

// CLASSIFY16 ORs the classes of the sixteen bytes at off(SI) into R8
// (digits), R9 ('0'), R10 (','), R11 (' ') and R12 (']'), shifted left
// by off. X8 holds '0', X9 9, X10 ',', X11 ' ' and X12 ']' in every
// byte. A byte is a digit when it less '0', wrapping, is at most 9: the
// unsigned minimum with 9 leaves it as it is.
#define CLASSIFY16(off) \
	MOVOU	off(SI), X0 \
	MOVO	X0, X1 \
	PSUBB	X8, X1 \
	MOVO	X1, X2 \
	PMINUB	X9, X2 \
	PCMPEQB	X1, X2 \
	PMOVMSKB	X2, AX \
	SHLQ	$off, AX \
	ORQ	AX, R8 \
	MOVO	X0, X3 \
	PCMPEQB	X8, X3 \
	PMOVMSKB	X3, AX \
	SHLQ	$off, AX \
	ORQ	AX, R9 \
	MOVO	X0, X4 \
	PCMPEQB	X10, X4 \
	PMOVMSKB	X4, AX \
	SHLQ	$off, AX \
	ORQ	AX, R10 \
	MOVO	X0, X5 \
	PCMPEQB	X11, X5 \
	PMOVMSKB	X5, AX \
	SHLQ	$off, AX \
	ORQ	AX, R11 \
	PCMPEQB	X12, X0 \
	PMOVMSKB	X0, AX \
	SHLQ	$off, AX \
	ORQ	AX, R12

// func classifyIDsSSE2(m *idClasses, p *byte)
TEXT ·classifyIDsSSE2(SB), NOSPLIT|NOFRAME, $0-16
	MOVQ	m+0(FP), DI
	MOVQ	p+8(FP), SI
	MOVQ	$0x3030303030303030, AX
	MOVQ	AX, X8
	PUNPCKLQDQ	X8, X8
	MOVQ	$0x0909090909090909, AX
	MOVQ	AX, X9
	PUNPCKLQDQ	X9, X9
	MOVQ	$0x2c2c2c2c2c2c2c2c, AX
	MOVQ	AX, X10
	PUNPCKLQDQ	X10, X10
	MOVQ	$0x2020202020202020, AX
	MOVQ	AX, X11
	PUNPCKLQDQ	X11, X11
	MOVQ	$0x5d5d5d5d5d5d5d5d, AX
	MOVQ	AX, X12
	PUNPCKLQDQ	X12, X12
	XORQ	R8, R8
	XORQ	R9, R9
	XORQ	R10, R10
	XORQ	R11, R11
	XORQ	R12, R12
	CLASSIFY16(0)
	CLASSIFY16(16)
	CLASSIFY16(32)
	CLASSIFY16(48)
	MOVQ	R8, 0(DI)
	MOVQ	R9, 8(DI)
	MOVQ	R10, 16(DI)
	MOVQ	R11, 24(DI)
	MOVQ	R12, 32(DI)
	RET
