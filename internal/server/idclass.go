package server

import "encoding/binary"

// idClasses has one bit per byte of a 64-byte block of a token id array,
// the block's first byte lowest, for each class of byte idRun tells
// apart: a decimal digit, '0' among them, ',', ' ' and ']'.
type idClasses struct {
	digit, zero, comma, space, close uint64
}

// classifyIDsGo is classifyIDs in portable Go, eight bytes at a time.
func classifyIDsGo(m *idClasses, p []byte) {
	const ones = 0x0101010101010101
	_ = p[63]
	*m = idClasses{}
	for w := range 8 {
		x := binary.LittleEndian.Uint64(p[8*w:])
		sh := uint(8 * w)
		m.digit |= gatherTops(^nonDigits(x^0x30*ones)&(0x80*ones)) << sh
		m.zero |= gatherTops(zeroBytes(x^'0'*ones)) << sh
		m.comma |= gatherTops(zeroBytes(x^','*ones)) << sh
		m.space |= gatherTops(zeroBytes(x^' '*ones)) << sh
		m.close |= gatherTops(zeroBytes(x^']'*ones)) << sh
	}
}

// zeroBytes sets the top bit of each byte of x that is zero, exactly:
// adding 0x7f to a byte's low seven bits sets its top bit unless they
// are all zero, and the byte's own top bit is kept out.
func zeroBytes(x uint64) uint64 {
	const low7 = 0x7f7f7f7f7f7f7f7f
	return ^((x&low7 + low7) | x) & 0x8080808080808080
}

// gatherTops moves the top bit of each byte of m into one byte, the
// first byte's lowest.
func gatherTops(m uint64) uint64 { return (m >> 7) * 0x0102040810204080 >> 56 }
