package kvindex

import (
	"encoding/binary"

	"github.com/kvcar/kvcar/internal/blockhash"
)

// Key is the XXH3-128 content key of a block: the hash of its parent's key
// and its own tokens, so equal keys mean equal prefixes (R-IDX-1). Hi is
// the high 64 bits of the XXH3-128 value, Lo the low 64 bits.
type Key struct{ Hi, Lo uint64 }

// KeyLen is the size of a content key in its byte form.
const KeyLen = 16

// PutKey writes k in the byte order that chains a child's hash to its
// parent: high 64 bits first, each half big-endian. This matches the
// canonical XXH3-128 digest and the block hasher of xllm-service, and is
// the order blockhash.SumAfter takes a parent's halves in (blockKey hands
// them over as words). dst must hold KeyLen bytes.
func PutKey(dst []byte, k Key) {
	_ = dst[KeyLen-1]
	binary.BigEndian.PutUint64(dst[0:8], k.Hi)
	binary.BigEndian.PutUint64(dst[8:16], k.Lo)
}

// Bytes returns k in its canonical byte form (see PutKey).
func (k Key) Bytes() [KeyLen]byte {
	var b [KeyLen]byte
	PutKey(b[:], k)
	return b
}

// Hasher computes content keys for one block size and seed. It owns the
// seed's XXH3 secret, derived once, and a scratch buffer (for a short
// block's parent key and ids, and for ids on machines where they are not
// laid out as the key hashes them), so that hashing never allocates. A
// Hasher is not safe for concurrent use.
type Hasher struct {
	blockSize int
	bh        blockhash.Hasher
	buf       []byte
}

// NewHasher returns a Hasher for blocks of blockSize tokens hashed with
// seed. blockSize must be positive.
func NewHasher(blockSize int, seed uint64) *Hasher {
	if blockSize <= 0 {
		panic("kvindex: non-positive block size")
	}
	return &Hasher{
		blockSize: blockSize,
		bh:        blockhash.New(seed),
		buf:       make([]byte, KeyLen+4*blockSize),
	}
}

// BlockSize returns the number of tokens per block.
func (h *Hasher) BlockSize() int { return h.blockSize }

// Seed returns the hash seed.
func (h *Hasher) Seed() uint64 { return h.bh.Seed() }

// BlockKey returns the content key of one block. A root block (hasParent
// false) hashes only its tokens; any other block hashes its parent's key
// followed by its tokens. block must hold exactly BlockSize tokens.
func (h *Hasher) BlockKey(parent Key, hasParent bool, block []uint32) Key {
	return blockKey(&h.bh, h.buf, parent, hasParent, block)
}

// Keys appends to dst[:0] the content keys of the full blocks of tokens; a
// trailing partial block is ignored because the engine only caches full
// blocks (R-IDX-3). It does not allocate when dst has enough capacity.
func (h *Hasher) Keys(tokens []uint32, dst []Key) []Key {
	return appendKeys(&h.bh, h.buf, h.blockSize, tokens, dst[:0])
}

// maxStackBlock bounds the block size KeysFor hashes without a heap
// buffer where one is needed; engines use 16 to 256 tokens per block.
const maxStackBlock = 1024

// KeysFor is Hasher.Keys without a Hasher: it appends the keys of the full
// blocks of tokens to dst[:0]. It does not allocate when dst has enough
// capacity and blockSize is at most 1024. blockSize must be positive.
func KeysFor(tokens []uint32, blockSize int, seed uint64, dst []Key) []Key {
	if blockSize <= 0 {
		panic("kvindex: non-positive block size")
	}
	var stack [KeyLen + 4*maxStackBlock]byte
	var buf []byte
	if blockSize <= maxStackBlock {
		buf = stack[:KeyLen+4*blockSize]
	} else {
		buf = make([]byte, KeyLen+4*blockSize)
	}
	bh := blockhash.New(seed)
	return appendKeys(&bh, buf, blockSize, tokens, dst[:0])
}

func appendKeys(bh *blockhash.Hasher, buf []byte, blockSize int, tokens []uint32, dst []Key) []Key {
	n := len(tokens) / blockSize
	var prev Key
	for i := 0; i < n; i++ {
		prev = blockKey(bh, buf, prev, i > 0, tokens[i*blockSize:(i+1)*blockSize])
		dst = append(dst, prev)
	}
	return dst
}

// blockKey hashes parent||tokens (or tokens alone for a root) through
// buf, of KeyLen+4*len(block) bytes: its tail holds the ids where they
// must be re-encoded, and the whole of it a short block's copy. Tokens are
// hashed as 32-bit little-endian integers, the engine's in-memory layout
// of int32 ids.
func blockKey(bh *blockhash.Hasher, buf []byte, parent Key, hasParent bool, block []uint32) Key {
	tok := tokenBytes(buf[KeyLen:], block)
	var hi, lo uint64
	if hasParent {
		hi, lo = bh.SumAfter(buf, parent.Hi, parent.Lo, tok)
	} else {
		hi, lo = bh.Sum(buf, tok)
	}
	return Key{Hi: hi, Lo: lo}
}
