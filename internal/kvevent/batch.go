package kvevent

import (
	"errors"
	"unsafe"
)

var (
	// ErrMalformed wraps every failure to parse frames or a payload.
	ErrMalformed = errors.New("kvevent: malformed message")
	// ErrTooLarge reports a payload above the decoder's size limit; it is
	// returned before any byte of the payload is read.
	ErrTooLarge = errors.New("kvevent: message too large")
	// ErrDecoderFault marks, beside ErrMalformed, a message the decoder
	// itself failed on (a runtime panic it recovered from): a defect of
	// the decoder's, which its fuzz targets look for.
	ErrDecoderFault = errors.New("kvevent: decoder fault")
)

// Reset empties the batch and keeps its storage for reuse.
func (b *Batch) Reset() {
	b.Timestamp = 0
	b.HasDPRank = false
	b.DPRank = 0
	clear(b.Events)
	b.Events = b.Events[:0]
	b.hashes = b.hashes[:0]
	b.tokens = b.tokens[:0]
}

// appendHashes copies hs into the batch's storage and returns the copy.
// Earlier events keep pointing at the old array when the storage grows,
// which stays valid because nothing writes to it again.
func (b *Batch) appendHashes(hs []EngineHash) []EngineHash {
	start := len(b.hashes)
	b.hashes = append(b.hashes, hs...)
	return b.hashes[start:len(b.hashes):len(b.hashes)]
}

func (b *Batch) appendTokens(ts []uint32) []uint32 {
	start := len(b.tokens)
	b.tokens = append(b.tokens, ts...)
	return b.tokens[start:len(b.tokens):len(b.tokens)]
}

// AddStored appends a plain-text BlockStored event, copying hashes and
// tokens into the batch. Pass empty tokens and blockSize 0 for a tokenless
// replica. Set PlainText to false on the appended event to mark LoRA or
// multimodal context.
func (b *Batch) AddStored(hashes []EngineHash, parent EngineHash, hasParent bool, tokens []uint32, blockSize int, m Medium) {
	ev := Event{
		Kind:        BlockStored,
		Medium:      m,
		BlockHashes: b.appendHashes(hashes),
		HasParent:   hasParent,
		TokenIDs:    b.appendTokens(tokens),
		BlockSize:   blockSize,
		PlainText:   true,
	}
	if hasParent {
		ev.ParentHash = parent
	}
	b.Events = append(b.Events, ev)
}

// AddRemoved appends a BlockRemoved event, copying hashes.
func (b *Batch) AddRemoved(hashes []EngineHash, m Medium) {
	b.Events = append(b.Events, Event{
		Kind:        BlockRemoved,
		Medium:      m,
		BlockHashes: b.appendHashes(hashes),
		PlainText:   true,
	})
}

// AddCleared appends an AllBlocksCleared event.
func (b *Batch) AddCleared() {
	b.Events = append(b.Events, Event{Kind: AllBlocksCleared, PlainText: true})
}

// Tokens returns the number of token ids carried by the batch.
func (b *Batch) Tokens() int {
	n := 0
	for i := range b.Events {
		n += len(b.Events[i].TokenIDs)
	}
	return n
}

// Clone returns a deep copy that shares nothing with b, so it survives
// b being decoded into again (buffering live batches during a snapshot).
func (b *Batch) Clone() *Batch {
	c := &Batch{
		Timestamp: b.Timestamp,
		HasDPRank: b.HasDPRank,
		DPRank:    b.DPRank,
		Events:    make([]Event, len(b.Events)),
		hashes:    make([]EngineHash, 0, b.Blocks()),
		tokens:    make([]uint32, 0, b.Tokens()),
	}
	for i := range b.Events {
		ev := b.Events[i]
		ev.BlockHashes = c.appendHashes(ev.BlockHashes)
		ev.TokenIDs = c.appendTokens(ev.TokenIDs)
		c.Events[i] = ev
	}
	return c
}

// eventSize, hashSize and walkSize are the in-memory sizes of one
// decoded event record, one engine hash and the memory token arrays are
// walked in.
const (
	eventSize = int(unsafe.Sizeof(Event{}))
	hashSize  = int(unsafe.Sizeof(EngineHash{}))
	walkSize  = int(unsafe.Sizeof(walkScratch{}))
	tmplSize  = int(unsafe.Sizeof(templates{}))
)

// StorageBytes is the memory the batch's reusable storage holds, by
// capacity: what keeping the batch for the next decode costs. A holder
// that decoded an unusually large payload can drop the batch rather than
// keep that much per stream.
func (b *Batch) StorageBytes() int {
	n := cap(b.Events)*eventSize + cap(b.hashes)*hashSize + cap(b.tokens)*4
	if b.walk != nil {
		n += walkSize
	}
	if b.tmpl != nil {
		n += tmplSize
	}
	return n
}

// MaxStorageBytes bounds StorageBytes of a fresh batch decoded from an
// n-byte payload, so a size limit on payloads is a size limit on decoded
// memory too. Each wire byte becomes at most 16 bytes of records (a
// 14-byte event is a record of under 112 bytes, a 1-byte hash 16 bytes,
// a 1-byte token 4) and appending may double the hash and token storage;
// the memory token arrays are walked in is a fixed 2.6 KB, the templates
// of a message of many events under 1 KB.
func MaxStorageBytes(n int) int { return 32*n + 256 + walkSize + tmplSize }

// DecodedBytes estimates the memory the decoded records occupy (event
// records, hashes and tokens), for budgets such as max_buffered_bytes that
// count decoded state on top of wire bytes.
func (b *Batch) DecodedBytes() int {
	return len(b.Events)*eventSize + b.Blocks()*hashSize + b.Tokens()*4
}
