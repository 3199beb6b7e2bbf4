//go:build !purego

#include "textflag.h"

// Each lane i of a stripe adds its input word to accumulator i^1 (the
// shuffle by 0x4E swaps the two words of each 128-bit half) and the
// product of the two halves of word^secret to accumulator i (the
// shuffle by 0x31 brings each word's high half under its low one for
// VPMULUDQ). Sums and products go to separate registers, added at the
// end, so that a stripe waits on one add, not two.

// func accumAVX2(acc *[8]uint64, p, secret *byte, n int)
TEXT ·accumAVX2(SB), NOSPLIT, $0-32
	MOVQ acc+0(FP), AX
	MOVQ p+8(FP), SI
	MOVQ secret+16(FP), DX
	MOVQ n+24(FP), CX
	VMOVDQU (AX), Y0
	VMOVDQU 32(AX), Y1
	VPXOR Y8, Y8, Y8
	VPXOR Y9, Y9, Y9

loop2:
	VMOVDQU (SI), Y2
	VMOVDQU 32(SI), Y3
	VPXOR (DX), Y2, Y4
	VPXOR 32(DX), Y3, Y5
	VPSHUFD $0x31, Y4, Y6
	VPSHUFD $0x31, Y5, Y7
	VPMULUDQ Y4, Y6, Y6
	VPMULUDQ Y5, Y7, Y7
	VPSHUFD $0x4E, Y2, Y2
	VPSHUFD $0x4E, Y3, Y3
	VPADDQ Y2, Y0, Y0
	VPADDQ Y3, Y1, Y1
	VPADDQ Y6, Y8, Y8
	VPADDQ Y7, Y9, Y9
	ADDQ $64, SI
	ADDQ $8, DX
	DECQ CX
	JNZ  loop2

	VPADDQ Y8, Y0, Y0
	VPADDQ Y9, Y1, Y1
	VMOVDQU Y0, (AX)
	VMOVDQU Y1, 32(AX)
	VZEROUPPER
	RET

// The accumulators' starting values (XXH3's).
DATA accInit<>+0(SB)/8, $0x00000000C2B2AE3D
DATA accInit<>+8(SB)/8, $0x9E3779B185EBCA87
DATA accInit<>+16(SB)/8, $0xC2B2AE3D27D4EB4F
DATA accInit<>+24(SB)/8, $0x165667B19E3779F9
DATA accInit<>+32(SB)/8, $0x85EBCA77C2B2AE63
DATA accInit<>+40(SB)/8, $0x0000000085EBCA77
DATA accInit<>+48(SB)/8, $0x27D4EB2F165667C5
DATA accInit<>+56(SB)/8, $0x000000009E3779B1
GLOBL accInit<>(SB), RODATA|NOPTR, $64

// scramble's multiplier, XXH3's prime32_1.
DATA scrambleMul<>+0(SB)/8, $0x000000009E3779B1
GLOBL scrambleMul<>(SB), RODATA|NOPTR, $8

// STRIPE adds the stripe in Z2 with the secret at DX: input words to Z0
// (swapped), products to Z1.
#define STRIPE \
	VPXORQ   (DX), Z2, Z4 \
	VPSHUFD  $0x31, Z4, Z6 \
	VPMULUDQ Z4, Z6, Z6 \
	VPSHUFD  $0x4E, Z2, Z2 \
	VPADDQ   Z2, Z0, Z0 \
	VPADDQ   Z6, Z1, Z1

// func stripesAVX512(acc *[8]uint64, headed int, h0, h1 uint64, body, secret *byte, n int, last *byte)
//
// All of an input's stripes: n full ones from the start, the first made
// of the words h0 and h1 and body's first 48 bytes when headed is not 0
// (else body's first 64), the others from body at 64-16 (or 64) bytes on,
// the accumulators scrambled after every 16th; then the 64 bytes at last
// with the secret from byte 121. n is at least 1.
TEXT ·stripesAVX512(SB), NOSPLIT, $0-64
	MOVQ acc+0(FP), AX
	MOVQ headed+8(FP), BX
	MOVQ body+32(FP), SI
	MOVQ secret+40(FP), DX
	MOVQ n+48(FP), CX
	MOVQ last+56(FP), DI
	MOVQ DX, R11
	XORQ R10, R10
	VMOVDQU64 accInit<>(SB), Z0
	VPXORQ    Z1, Z1, Z1
	VPBROADCASTQ scrambleMul<>(SB), Z7
	VMOVDQU64 (SI), Z2
	ADDQ      $64, SI
	TESTQ     BX, BX
	JZ        first
	MOVQ      h0+16(FP), R8
	MOVQ      h1+24(FP), R9
	VMOVQ     R8, X3
	VPINSRQ   $1, R9, X3, X3
	VINSERTI32X4 $3, X3, Z3, Z3
	VALIGNQ   $6, Z3, Z2, Z2
	SUBQ      $16, SI

first:
	STRIPE
	JMP next

loop:
	VMOVDQU64 (SI), Z2
	STRIPE
	ADDQ $64, SI

next:
	ADDQ $8, DX
	INCQ R10
	CMPQ R10, $16
	JNE  more
	// The end of a block: scramble, and start the secret again.
	VPADDQ    Z1, Z0, Z0
	VPXORQ    Z1, Z1, Z1
	VPSRLQ    $47, Z0, Z4
	VPXORQ    Z4, Z0, Z0
	VPXORQ    128(R11), Z0, Z0
	VPSRLQ    $32, Z0, Z4
	VPMULUDQ  Z7, Z0, Z0
	VPMULUDQ  Z7, Z4, Z4
	VPSLLQ    $32, Z4, Z4
	VPADDQ    Z4, Z0, Z0
	MOVQ      R11, DX
	XORQ      R10, R10

more:
	DECQ CX
	JNZ  loop

	VMOVDQU64 (DI), Z2
	LEAQ      121(R11), DX
	STRIPE
	VPADDQ    Z1, Z0, Z0
	VMOVDQU64 Z0, (AX)
	VZEROUPPER
	RET
