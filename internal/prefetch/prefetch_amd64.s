#include "textflag.h"

// func Addr(p uintptr)
TEXT ·Addr(SB), NOSPLIT|NOFRAME, $0-8
	MOVQ	p+0(FP), AX
	PREFETCHT0	(AX)
	RET
