package kvevent

import (
	"encoding/binary"

	"github.com/tinylib/msgp/msgp"
)

// HashForm selects how AppendBatch writes engine hashes.
type HashForm uint8

const (
	// HashUint64 writes hashes as unsigned integers (values >= 2^63 become
	// msgpack uint64).
	HashUint64 HashForm = iota
	// HashInt64 writes hashes as signed integers with the same 64-bit
	// pattern, as engines with signed hashes do.
	HashInt64
	// HashBytes8 writes hashes as 8-byte big-endian bin strings, which
	// FoldBytesHash maps back to the same EngineHash.
	HashBytes8
)

// Shape selects one of the wire shapes engines send (R-WIRE-2).
type Shape struct {
	// BatchAsMap writes {"ts","events","data_parallel_rank"} instead of
	// [ts, events, dp_rank].
	BatchAsMap bool
	// EventsAsArrays writes ["BlockStored", ...] instead of tagged maps.
	EventsAsArrays bool
	Hashes         HashForm
	// UpperMedium writes "GPU"/"CPU" instead of "gpu"/"cpu".
	UpperMedium bool
	// OmitDPRank leaves the rank out (2-element array or no map key);
	// otherwise a batch without a rank carries nil.
	OmitDPRank bool
}

// nonPlainLoraID is written for events that are not plain text so the
// decoder marks them non-plain again (R-WIRE-5).
const nonPlainLoraID = 1

// AppendBatch appends the MessagePack encoding of b in shape s to dst.
func AppendBatch(dst []byte, b *Batch, s Shape) []byte {
	withRank := !s.OmitDPRank
	if s.BatchAsMap {
		n := uint32(2)
		if withRank && b.HasDPRank {
			n++
		}
		dst = msgp.AppendMapHeader(dst, n)
		dst = msgp.AppendString(dst, keyTS)
		dst = msgp.AppendFloat64(dst, b.Timestamp)
		dst = msgp.AppendString(dst, keyEvents)
		dst = appendEvents(dst, b.Events, s)
		if withRank && b.HasDPRank {
			dst = msgp.AppendString(dst, keyDPRank)
			dst = msgp.AppendInt(dst, b.DPRank)
		}
		return dst
	}
	n := uint32(2)
	if withRank {
		n++
	}
	dst = msgp.AppendArrayHeader(dst, n)
	dst = msgp.AppendFloat64(dst, b.Timestamp)
	dst = appendEvents(dst, b.Events, s)
	if withRank {
		if b.HasDPRank {
			dst = msgp.AppendInt(dst, b.DPRank)
		} else {
			dst = msgp.AppendNil(dst)
		}
	}
	return dst
}

func appendEvents(dst []byte, evs []Event, s Shape) []byte {
	dst = msgp.AppendArrayHeader(dst, uint32(len(evs)))
	for i := range evs {
		if s.EventsAsArrays {
			dst = appendEventArray(dst, &evs[i], s)
		} else {
			dst = appendEventMap(dst, &evs[i], s)
		}
	}
	return dst
}

func appendEventMap(dst []byte, ev *Event, s Shape) []byte {
	switch ev.Kind {
	case BlockStored:
		dst = msgp.AppendMapHeader(dst, 7)
		dst = msgp.AppendString(dst, keyType)
		dst = msgp.AppendString(dst, BlockStored.String())
		dst = msgp.AppendString(dst, keyBlockHashes)
		dst = appendHashes(dst, ev.BlockHashes, s.Hashes)
		dst = msgp.AppendString(dst, keyParent)
		dst = appendParent(dst, ev, s.Hashes)
		dst = msgp.AppendString(dst, keyTokenIDs)
		dst = appendTokens(dst, ev.TokenIDs)
		dst = msgp.AppendString(dst, keyBlockSize)
		dst = msgp.AppendInt(dst, ev.BlockSize)
		dst = msgp.AppendString(dst, keyLoraID)
		dst = appendLoraID(dst, ev)
		dst = msgp.AppendString(dst, keyMedium)
		return appendMedium(dst, ev.Medium, s.UpperMedium)
	case BlockRemoved:
		dst = msgp.AppendMapHeader(dst, 3)
		dst = msgp.AppendString(dst, keyType)
		dst = msgp.AppendString(dst, BlockRemoved.String())
		dst = msgp.AppendString(dst, keyBlockHashes)
		dst = appendHashes(dst, ev.BlockHashes, s.Hashes)
		dst = msgp.AppendString(dst, keyMedium)
		return appendMedium(dst, ev.Medium, s.UpperMedium)
	default:
		dst = msgp.AppendMapHeader(dst, 1)
		dst = msgp.AppendString(dst, keyType)
		return msgp.AppendString(dst, ev.Kind.String())
	}
}

func appendEventArray(dst []byte, ev *Event, s Shape) []byte {
	switch ev.Kind {
	case BlockStored:
		dst = msgp.AppendArrayHeader(dst, 7)
		dst = msgp.AppendString(dst, BlockStored.String())
		dst = appendHashes(dst, ev.BlockHashes, s.Hashes)
		dst = appendParent(dst, ev, s.Hashes)
		dst = appendTokens(dst, ev.TokenIDs)
		dst = msgp.AppendInt(dst, ev.BlockSize)
		dst = appendLoraID(dst, ev)
		return appendMedium(dst, ev.Medium, s.UpperMedium)
	case BlockRemoved:
		dst = msgp.AppendArrayHeader(dst, 3)
		dst = msgp.AppendString(dst, BlockRemoved.String())
		dst = appendHashes(dst, ev.BlockHashes, s.Hashes)
		return appendMedium(dst, ev.Medium, s.UpperMedium)
	default:
		dst = msgp.AppendArrayHeader(dst, 1)
		return msgp.AppendString(dst, ev.Kind.String())
	}
}

func appendHash(dst []byte, h EngineHash, f HashForm) []byte {
	switch f {
	case HashInt64:
		return msgp.AppendInt64(dst, int64(h))
	case HashBytes8:
		var raw [8]byte
		binary.BigEndian.PutUint64(raw[:], uint64(h))
		return msgp.AppendBytes(dst, raw[:])
	default:
		return msgp.AppendUint64(dst, uint64(h))
	}
}

func appendHashes(dst []byte, hs []EngineHash, f HashForm) []byte {
	dst = msgp.AppendArrayHeader(dst, uint32(len(hs)))
	for _, h := range hs {
		dst = appendHash(dst, h, f)
	}
	return dst
}

func appendParent(dst []byte, ev *Event, f HashForm) []byte {
	if !ev.HasParent {
		return msgp.AppendNil(dst)
	}
	return appendHash(dst, ev.ParentHash, f)
}

func appendTokens(dst []byte, ts []uint32) []byte {
	dst = msgp.AppendArrayHeader(dst, uint32(len(ts)))
	for _, t := range ts {
		dst = msgp.AppendUint32(dst, t)
	}
	return dst
}

func appendLoraID(dst []byte, ev *Event) []byte {
	if ev.PlainText {
		return msgp.AppendNil(dst)
	}
	return msgp.AppendInt(dst, nonPlainLoraID)
}

func appendMedium(dst []byte, m Medium, upper bool) []byte {
	switch {
	case m == Host && upper:
		return msgp.AppendString(dst, "CPU")
	case m == Host:
		return msgp.AppendString(dst, "cpu")
	case upper:
		return msgp.AppendString(dst, "GPU")
	default:
		return msgp.AppendString(dst, "gpu")
	}
}
