package kvindex

import "encoding/binary"

// putTokensPortable writes tokens as 32-bit little-endian integers on any
// architecture. dst must hold 4*len(tokens) bytes.
func putTokensPortable(dst []byte, tokens []uint32) {
	dst = dst[:4*len(tokens)]
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(dst[4*i:4*i+4], t)
	}
}
