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

// BCAST16 and BCAST32 set X (Y) to the byte b in every lane. They
// clobber AX. What the AVX2 functions run is VEX-encoded throughout,
// BCAST32's and LANES32's moves too: each legacy SSE instruction among
// them cost a state change on Intel processors: fillPairsWide took
// 1.1 µs a call at n=96, where it takes 21 ns (BenchmarkFill).
#define BCAST16(b, X) \
	MOVQ	$b, AX \
	MOVQ	AX, X \
	PUNPCKLQDQ	X, X

#define BCAST32(b, X, Y) \
	MOVQ	$b, AX \
	VMOVQ	AX, X \
	VPBROADCASTQ	X, Y

// LANES16 sets X12 to each lane's index, X13 to 15 and X14 to 16 in
// every byte, for PICK16. It clobbers AX and X6.
#define LANES16 \
	MOVQ	$0x0706050403020100, AX \
	MOVQ	AX, X12 \
	MOVQ	$0x0f0e0d0c0b0a0908, AX \
	MOVQ	AX, X6 \
	PUNPCKLQDQ	X6, X12 \
	BCAST16(0x0f0f0f0f0f0f0f0f, X13) \
	BCAST16(0x1010101010101010, X14)

// LANES32 is LANES16 for PICK32: Y12 holds each byte's index in its
// 16-byte half. It clobbers AX and X13.
#define LANES32 \
	MOVQ	$0x0706050403020100, AX \
	VMOVQ	AX, X12 \
	MOVQ	$0x0f0e0d0c0b0a0908, AX \
	VMOVQ	AX, X13 \
	VPUNPCKLQDQ	X13, X12, X12 \
	VINSERTI128	$1, X12, Y12, Y12 \
	BCAST32(0x0f0f0f0f0f0f0f0f, X13, Y13) \
	BCAST32(0x1010101010101010, X14, Y14)

// PICK16 sets D to each lane of S plus the byte that many lanes on in
// S followed by N: I = lane + S is that byte's place, in S below 16, in
// N from 16 (S's values are at most 12, so I is at most 27). PSHUFB
// gives zero for an index with its top bit set: J is I with the lanes
// of 16 and above all ones, I-16 is negative below 16. It needs
// LANES16 and clobbers I, J and T.
#define PICK16(S, N, D, I, J, T) \
	MOVO	S, I \
	PADDB	X12, I \
	MOVO	I, J \
	PCMPGTB	X13, J \
	POR	I, J \
	MOVO	S, D \
	PSHUFB	J, D \
	PSUBB	X14, I \
	MOVO	N, T \
	PSHUFB	I, T \
	POR	T, D \
	PADDB	S, D

// PICK32 is PICK16 for both 16-byte halves of S, N holding the sixteen
// bytes after each half. It needs LANES32 and clobbers I, J and N.
#define PICK32(S, N, D, I, J) \
	VPADDB	Y12, S, I \
	VPCMPGTB	Y13, I, J \
	VPOR	I, J, J \
	VPSHUFB	J, S, D \
	VPSUBB	Y14, I, I \
	VPSHUFB	I, N, N \
	VPOR	N, D, D \
	VPADDB	S, D, D

// FLAGS16 sets D to W, the widths of the bytes B, with notID set in the
// lanes of bytes that are no id's type byte (notIDFlags): v = byte^0xcc
// is below 3 only for 0xcc to 0xce. X10, X11, X6 and X7 hold 0xcc,
// 0x7f, 0x7d and 0x80 in every byte; it clobbers T.
#define FLAGS16(B, W, D, T) \
	MOVO	B, T \
	PXOR	X10, T \
	MOVO	T, D \
	PAND	X11, D \
	PADDB	X6, D \
	POR	T, D \
	PAND	B, D \
	PAND	X7, D \
	POR	W, D

// FLAGS32 is FLAGS16 in Y registers.
#define FLAGS32(B, W, D, T) \
	VPXOR	Y10, B, T \
	VPAND	Y11, T, D \
	VPADDB	Y6, D, D \
	VPOR	T, D, D \
	VPAND	B, D, D \
	VPAND	Y7, D, D \
	VPOR	W, D, D

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

// func fillPairsSSSE3(ws, ws2 *byte, p *byte, n int)
//
// ws gets the widths of p's first n bytes, as idWidths, with
// notIDFlags' flags; ws2 each byte's width plus the width of the byte
// that many bytes on: the distance to the id after next, which PSHUFB
// (SSSE3) picks from this block of sixteen widths or the next. p holds
// n+16 bytes; n is a positive multiple of 16.
TEXT ·fillPairsSSSE3(SB), NOSPLIT|NOFRAME, $0-32
	MOVQ	ws+0(FP), DI
	MOVQ	ws2+8(FP), DX
	MOVQ	p+16(FP), SI
	MOVQ	n+24(FP), CX
	BCAST16(0x0101010101010101, X8)
	BCAST16(0x0303030303030303, X9)
	LANES16
	BCAST16(0xcccccccccccccccc, X10)
	BCAST16(0x7f7f7f7f7f7f7f7f, X11)
	BCAST16(0x7d7d7d7d7d7d7d7d, X6)
	BCAST16(0x8080808080808080, X7)
	WIDTHS((SI), X0, X4, X5)

loop:
	WIDTHS(16(SI), X1, X4, X5)
	PICK16(X0, X1, X4, X2, X3, X5)
	MOVOU	X4, (DX)
	MOVOU	(SI), X3
	FLAGS16(X3, X0, X4, X5)
	MOVOU	X4, (DI)
	MOVO	X1, X0
	ADDQ	$16, SI
	ADDQ	$16, DI
	ADDQ	$16, DX
	SUBQ	$16, CX
	JNZ	loop
	RET

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
	BCAST32(0x0101010101010101, X8, Y8)
	BCAST32(0x0303030303030303, X9, Y9)
	BCAST32(0xcccccccccccccccc, X10, Y10)
	BCAST32(0x7f7f7f7f7f7f7f7f, X11, Y11)
	BCAST32(0x7d7d7d7d7d7d7d7d, X6, Y6)
	BCAST32(0x8080808080808080, X7, Y7)
	LANES32
	WIDTHS32((SI), Y0, Y3, Y4)

loop32:
	WIDTHS32(32(SI), Y1, Y3, Y4)
	// Y2: the widths of the sixteen bytes after each half.
	VPERM2I128	$0x21, Y1, Y0, Y2
	PICK32(Y0, Y2, Y5, Y3, Y4)
	VMOVDQU	Y5, (DX)
	VMOVDQU	(SI), Y3
	FLAGS32(Y3, Y0, Y5, Y4)
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
	LANES16

quads16:
	MOVOU	(SI), X0
	MOVOU	16(SI), X1
	PICK16(X0, X1, X4, X2, X3, X5)
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
	LANES32

quads32:
	VMOVDQU	(SI), Y0
	VMOVDQU	16(SI), Y1
	PICK32(Y0, Y1, Y4, Y2, Y3)
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
