package kvevent

// Medium is the storage tier a block replica lives on.
type Medium uint8

const (
	// Device is accelerator memory ("gpu"/"GPU" on the wire, and nil).
	Device Medium = iota
	// Host is host memory ("cpu"/"CPU" on the wire).
	Host
)

func (m Medium) String() string {
	if m == Host {
		return "cpu"
	}
	return "gpu"
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

// EngineHash is the engine's opaque block identifier. Integer hashes
// (uint64 or int64 on the wire) keep their 64-bit pattern; byte-string
// hashes (bin or str) of exactly 8 bytes are read as a big-endian uint64
// and any other length is folded to 64 bits with XXH3-64 (FoldBytesHash),
// so the index never keeps variable-length identifiers.
type EngineHash uint64

// Event is one decoded KV event. Slices alias storage owned by the Batch
// that holds the event and are valid until that Batch is decoded into again.
type Event struct {
	Kind   Kind
	Medium Medium

	// BlockHashes are the engine hashes of the blocks, parent first.
	BlockHashes []EngineHash

	// HasParent is false for a root block (parent_block_hash nil).
	HasParent  bool
	ParentHash EngineHash

	// TokenIDs holds len(BlockHashes)*BlockSize tokens for a full store,
	// or is empty for a tokenless replica announcement.
	TokenIDs  []uint32
	BlockSize int

	// PlainText is false when the event carries a LoRA id/name or
	// non-empty extra_keys: such blocks are not indexed (R-WIRE-5).
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
}

// Blocks returns the number of block hashes carried by the batch.
func (b *Batch) Blocks() int {
	n := 0
	for i := range b.Events {
		n += len(b.Events[i].BlockHashes)
	}
	return n
}
