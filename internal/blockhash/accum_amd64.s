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

// FOLD adds to r the fold of the two words of x (XXH3's mul128_fold64:
// the 128-bit product's halves XORed). It takes AX, CX and DX.
#define FOLD(x, r) \
	VMOVQ   x, AX \
	VPEXTRQ $1, x, CX \
	MULQ    CX \
	XORQ    DX, AX \
	ADDQ    AX, r

// AVALANCHE is XXH3's avalanche of r. It takes AX.
#define AVALANCHE(r) \
	MOVQ  r, AX \
	SHRQ  $37, AX \
	XORQ  AX, r \
	MOVQ  $0x165667919E3779F9, AX \
	IMULQ AX, r \
	MOVQ  r, AX \
	SHRQ  $32, AX \
	XORQ  AX, r

// func longAVX512(headed int, h0, h1 uint64, body, secret *byte, n int, last *byte, fold *[16]uint64, l int) (hi, lo uint64)
//
// XXH3's long-input path over an input of l bytes: its stripes, n full
// ones from the start, the first made of the words h0 and h1 and body's
// first 48 bytes when headed is not 0 (else body's first 64), the others
// from body at 64-16 (or 64) bytes on, the accumulators scrambled after
// every 16th; then the 64 bytes at last with the secret from byte 121;
// then the merge of the accumulators into the hash's halves with the
// secret's words in fold (Hasher.merge). n is at least 1. The merge is
// done here so that the accumulators do not go through memory to be read
// back word by word: a prompt's chain of keys takes 0.85-0.87 of the time
// it took with the merge in Go (the performance log's "The merge in the
// assembly").
TEXT ·longAVX512(SB), NOSPLIT, $0-88
	MOVQ headed+0(FP), BX
	MOVQ body+24(FP), SI
	MOVQ secret+32(FP), DX
	MOVQ n+40(FP), CX
	MOVQ last+48(FP), DI
	MOVQ DX, R11
	XORQ R10, R10
	VMOVDQU64 accInit<>(SB), Z0
	VPXORQ    Z1, Z1, Z1
	VPBROADCASTQ scrambleMul<>(SB), Z7
	VMOVDQU64 (SI), Z2
	ADDQ      $64, SI
	TESTQ     BX, BX
	JZ        first
	MOVQ      h0+8(FP), R8
	MOVQ      h1+16(FP), R9
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

	// The merge: lo from l*prime64_1 and the secret's words from byte 11,
	// hi from ^(l*prime64_2) and those from byte 117, each adding the folds
	// of the accumulators' pairs XORed with its words.
	MOVQ          fold+56(FP), BX
	VPXORQ        (BX), Z0, Z4
	VPXORQ        64(BX), Z0, Z5
	MOVQ          l+64(FP), R8
	MOVQ          $0x9E3779B185EBCA87, R12
	IMULQ         R8, R12
	MOVQ          $0xC2B2AE3D27D4EB4F, R13
	IMULQ         R8, R13
	NOTQ          R13
	FOLD(X4, R12)
	FOLD(X5, R13)
	VEXTRACTI32X4 $1, Z4, X6
	VEXTRACTI32X4 $1, Z5, X7
	FOLD(X6, R12)
	FOLD(X7, R13)
	VEXTRACTI32X4 $2, Z4, X6
	VEXTRACTI32X4 $2, Z5, X7
	FOLD(X6, R12)
	FOLD(X7, R13)
	VEXTRACTI32X4 $3, Z4, X6
	VEXTRACTI32X4 $3, Z5, X7
	FOLD(X6, R12)
	FOLD(X7, R13)
	VZEROUPPER
	AVALANCHE(R13)
	AVALANCHE(R12)
	MOVQ          R13, hi+72(FP)
	MOVQ          R12, lo+80(FP)
	RET
