package kvevent

import (
	"encoding/binary"
	"strconv"

	"github.com/zeebo/xxh3"
)

// Medium is the storage tier a block replica lives on. Only Device and
// Host are tiers the directory serves hits from (R-DIR-1); the others are
// decoded so that an event on them is recognised and kept out of both.
type Medium uint8

const (
	// Device is accelerator memory: "gpu"/"GPU"/"DEVICE", the empty
	// string and nil on the wire.
	Device Medium = iota
	// Host is host memory: "cpu", "CPU", "CPU_PINNED", "CPU_TIER1".
	Host
	// Disk is local storage below host memory: "CPU_TIER2", "DISK",
	// "NVME", "STORAGE". Reusing it costs a read from storage, so it is
	// neither a Device nor a Host hit.
	Disk
	// External is a pool outside the instance: "EXTERNAL", "NETWORK",
	// "REMOTE", "SHARED". It may be shared with other instances, so it
	// is never counted as this instance's cache.
	External
	// OtherMedium is any medium string the decoder does not know. Such
	// a replica is never reported as a hit: an unknown tier is
	// under-reported rather than guessed.
	OtherMedium
)

// Served reports whether replicas on m count as hits (Device or Host).
func (m Medium) Served() bool { return m == Device || m == Host }

func (m Medium) String() string {
	switch m {
	case Device:
		return "gpu"
	case Host:
		return "cpu"
	case Disk:
		return "disk"
	case External:
		return "external"
	}
	return "other"
}

// Kind is the type tag of an event.
type Kind uint8

const (
	BlockStored Kind = iota + 1
	BlockRemoved
	AllBlocksCleared
)

func (k Kind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "unknown"
}

// EngineHash is the engine's opaque block identifier, kept in 128 bits so
// that no engine's identifiers are truncated into silent collisions:
//
//   - an integer hash (msgpack uint64 or int64) keeps its 64-bit pattern
//     exactly, in Lo with Hi zero (IntHash);
//   - a byte-string hash of exactly 8 bytes is the same big-endian
//     integer, so an engine that ships its integer hash as raw bytes
//     agrees with one that sends the integer;
//   - a byte string of exactly 16 bytes is kept exactly (Hi from the
//     first eight, big-endian), so every EngineHash has a wire form;
//   - a byte string of any other length (vLLM's default is a 32-byte
//     sha256 digest) is reduced with XXH3-128 (BytesHash).
//
// Two distinct byte strings then share an EngineHash with probability
// 2^-128 per pair; with at most 2^24 blocks held per stream and every
// new block compared against them, that is below 2^-100 per block ever
// stored, against 2^-40 for a 64-bit fold (about one collision a year at
// 10,000 blocks a second). A byte hash meets an integer hash only if its
// 128-bit value has 64 zero high bits and the integer in its low bits
// (2^-64 for a 16-byte identifier, less for a digest).
// Engine hashes never become content keys (R-IDX-1), so a collision could
// at worst attach a replica to the wrong block.
type EngineHash struct{ Hi, Lo uint64 }

// IntHash is the EngineHash of an integer engine hash. A signed hash is
// passed as its 64-bit pattern, uint64(int64 value).
func IntHash(v uint64) EngineHash { return EngineHash{Lo: v} }

// BytesHash is the EngineHash of a byte-string engine hash (see
// EngineHash for the rule).
func BytesHash(b []byte) EngineHash {
	switch len(b) {
	case 8:
		return IntHash(binary.BigEndian.Uint64(b))
	case 16:
		return EngineHash{Hi: binary.BigEndian.Uint64(b[:8]), Lo: binary.BigEndian.Uint64(b[8:])}
	}
	u := xxh3.Hash128(b)
	return EngineHash{Hi: u.Hi, Lo: u.Lo}
}

// IsInt reports whether h can be written as one 64-bit integer.
func (h EngineHash) IsInt() bool { return h.Hi == 0 }

// String formats h as hex: 16 digits for an integer hash, 32 otherwise.
func (h EngineHash) String() string {
	if h.Hi == 0 {
		return "0x" + pad16(h.Lo)
	}
	return "0x" + pad16(h.Hi) + pad16(h.Lo)
}

func pad16(v uint64) string {
	s := strconv.FormatUint(v, 16)
	for len(s) < 16 {
		s = "0" + s
	}
	return s
}

// Event is one decoded KV event. Slices alias storage owned by the Batch
// that holds the event and are valid until that Batch is decoded into again.
type Event struct {
	Kind   Kind
	Medium Medium

	// BlockHashes are the engine hashes of the blocks, parent first.
	BlockHashes []EngineHash

	// HasParent is false for a root block (parent_block_hash nil, or 0
	// in a legacy array when the decoder is told that 0 means root).
	HasParent  bool
	ParentHash EngineHash

	// TokenIDs holds len(BlockHashes)*BlockSize tokens for a full store,
	// or is empty for a tokenless replica announcement.
	TokenIDs  []uint32
	BlockSize int

	// PlainText is false when the blocks' KV depends on more than their
	// tokens, or is not this instance's local cache: a LoRA id or name,
	// extra_keys with a non-nil entry, a cache_salt, a KV cache group
	// other than 0 or a spec kind other than full attention, locality
	// REMOTE, or token ids that are not plain integers. Such blocks are
	// not indexed as plain prefixes (R-WIRE-5).
	PlainText bool
}

// Batch is one live message payload or one replay reply payload.
type Batch struct {
	// Timestamp is the engine's wall clock in seconds since the epoch.
	Timestamp float64
	// HasDPRank is false when the batch omits the rank or sends nil.
	HasDPRank bool
	DPRank    int
	Events    []Event

	// Backing storage reused across decodes so a steady stream does not
	// allocate per message.
	hashes []EngineHash
	tokens []uint32
	// payload is the message being decoded, while DecodeBatch decodes
	// it: the bytes before a token array, for readIDsAt.
	payload []byte
	// walk is where token arrays are walked, kept from the first one on.
	walk *walkScratch
	// tmpl holds the templates of a message of many events (template.go),
	// kept from the first such message on.
	tmpl *templates
	// tokensRest is how many bytes of the message follow the last token
	// array decoded field by field: where a template's token slot ends.
	tokensRest int
	// generalOnly decodes every event field by field, for the tests and
	// benchmarks that compare the two ways.
	generalOnly bool
}

// Blocks returns the number of block hashes carried by the batch.
func (b *Batch) Blocks() int {
	n := 0
	for i := range b.Events {
		n += len(b.Events[i].BlockHashes)
	}
	return n
}
