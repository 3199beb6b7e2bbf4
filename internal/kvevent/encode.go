package kvevent

import (
	"crypto/sha256"
	"encoding/binary"
	"math/bits"
	"slices"

	"github.com/tinylib/msgp/msgp"
)

// HashForm selects how AppendBatch writes engine hashes. Every form
// writes a hash that is not an integer (EngineHash.IsInt false) as its
// 16-byte big-endian form, which BytesHash maps back to it.
type HashForm uint8

const (
	// HashUint64 writes hashes as unsigned integers (values >= 2^63 become
	// msgpack uint64).
	HashUint64 HashForm = iota
	// HashInt64 writes hashes as signed integers with the same 64-bit
	// pattern, as SGLang does.
	HashInt64
	// HashBytes8 writes hashes as 8-byte big-endian bin strings, which
	// BytesHash maps back to the same EngineHash.
	HashBytes8
	// HashDigest32 writes each hash as a 32-byte bin string, the SHA-256
	// of its 16-byte form, as vLLM sends its default sha256 block hashes.
	// The decoder reads it as DigestHash(h), not as h.
	HashDigest32
)

// Digest32 is the 32-byte string HashDigest32 writes for h.
func Digest32(h EngineHash) [32]byte {
	var raw [16]byte
	binary.BigEndian.PutUint64(raw[:8], h.Hi)
	binary.BigEndian.PutUint64(raw[8:], h.Lo)
	return sha256.Sum256(raw[:])
}

// Decoded returns the EngineHash a decoder reads for h written in form f:
// h itself except for HashDigest32.
func (f HashForm) Decoded(h EngineHash) EngineHash {
	if f == HashDigest32 {
		d := Digest32(h)
		return BytesHash(d[:])
	}
	return h
}

// Shape selects one of the wire shapes engines send (R-WIRE-2 and the
// dialects of vLLM and SGLang).
type Shape struct {
	// BatchAsMap writes {"ts","events","data_parallel_rank"} instead of
	// [ts, events, dp_rank].
	BatchAsMap bool
	// AttnDPRank names the map batch's rank attn_dp_rank, as SGLang does.
	AttnDPRank bool
	// EventsAsArrays writes ["BlockStored", ...] instead of tagged maps.
	EventsAsArrays bool
	Hashes         HashForm
	// UpperMedium writes "GPU"/"CPU" instead of "gpu"/"cpu".
	UpperMedium bool
	// PinnedHost writes Host as "CPU_PINNED", as SGLang does.
	PinnedHost bool
	// OmitDPRank leaves the rank out (2-element array or no map key);
	// otherwise a batch without a rank carries nil.
	OmitDPRank bool
	// VLLMFields adds the fields vLLM sends with a plain-text
	// BlockStored: lora_name nil, extra_keys [nil] per block, group_idx 0
	// and kv_cache_spec_kind "full_attention" (arrays get all eleven
	// positions, kv_cache_spec_sliding_window nil included).
	VLLMFields bool
	// SGLangMeta writes SGLang's older positional metadata map
	// {"cache_salt": nil} as the eighth element of array BlockStored
	// events, where vLLM has lora_name.
	SGLangMeta bool
	// ZeroRootParent writes a root's parent as 0 instead of nil in array
	// events, as one legacy publisher does.
	ZeroRootParent bool
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
			if s.AttnDPRank {
				dst = msgp.AppendString(dst, keyAttnDPRank)
			} else {
				dst = msgp.AppendString(dst, keyDPRank)
			}
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
		n := uint32(7)
		if s.VLLMFields {
			n += 4
		}
		dst = msgp.AppendMapHeader(dst, n)
		dst = msgp.AppendString(dst, keyType)
		dst = msgp.AppendString(dst, BlockStored.String())
		dst = msgp.AppendString(dst, keyBlockHashes)
		dst = appendHashes(dst, ev.BlockHashes, s.Hashes)
		dst = msgp.AppendString(dst, keyParent)
		dst = appendParent(dst, ev, s.Hashes, false)
		dst = msgp.AppendString(dst, keyTokenIDs)
		dst = appendTokens(dst, ev.TokenIDs)
		dst = msgp.AppendString(dst, keyBlockSize)
		dst = msgp.AppendInt(dst, ev.BlockSize)
		dst = msgp.AppendString(dst, keyLoraID)
		dst = appendLoraID(dst, ev)
		dst = msgp.AppendString(dst, keyMedium)
		dst = appendMedium(dst, ev.Medium, s)
		if s.VLLMFields {
			dst = msgp.AppendString(dst, keyLoraName)
			dst = msgp.AppendNil(dst)
			dst = msgp.AppendString(dst, keyExtraKeys)
			dst = appendNilPerBlock(dst, len(ev.BlockHashes))
			dst = msgp.AppendString(dst, keyGroupIdx)
			dst = msgp.AppendInt(dst, 0)
			dst = msgp.AppendString(dst, keySpecKind)
			dst = msgp.AppendString(dst, specFullAttention)
		}
		return dst
	case BlockRemoved:
		dst = msgp.AppendMapHeader(dst, 3)
		dst = msgp.AppendString(dst, keyType)
		dst = msgp.AppendString(dst, BlockRemoved.String())
		dst = msgp.AppendString(dst, keyBlockHashes)
		dst = appendHashes(dst, ev.BlockHashes, s.Hashes)
		dst = msgp.AppendString(dst, keyMedium)
		return appendMedium(dst, ev.Medium, s)
	default:
		dst = msgp.AppendMapHeader(dst, 1)
		dst = msgp.AppendString(dst, keyType)
		return msgp.AppendString(dst, ev.Kind.String())
	}
}

func appendEventArray(dst []byte, ev *Event, s Shape) []byte {
	switch ev.Kind {
	case BlockStored:
		n := uint32(7)
		switch {
		case s.VLLMFields:
			n = 12
		case s.SGLangMeta:
			n = 8
		}
		dst = msgp.AppendArrayHeader(dst, n)
		dst = msgp.AppendString(dst, BlockStored.String())
		dst = appendHashes(dst, ev.BlockHashes, s.Hashes)
		dst = appendParent(dst, ev, s.Hashes, s.ZeroRootParent)
		dst = appendTokens(dst, ev.TokenIDs)
		dst = msgp.AppendInt(dst, ev.BlockSize)
		dst = appendLoraID(dst, ev)
		dst = appendMedium(dst, ev.Medium, s)
		switch {
		case s.VLLMFields:
			dst = msgp.AppendNil(dst) // lora_name
			dst = appendNilPerBlock(dst, len(ev.BlockHashes))
			dst = msgp.AppendInt(dst, 0) // group_idx
			dst = msgp.AppendString(dst, specFullAttention)
			dst = msgp.AppendNil(dst) // kv_cache_spec_sliding_window
		case s.SGLangMeta:
			dst = msgp.AppendMapHeader(dst, 1)
			dst = msgp.AppendString(dst, keyCacheSalt)
			dst = msgp.AppendNil(dst)
		}
		return dst
	case BlockRemoved:
		dst = msgp.AppendArrayHeader(dst, 3)
		dst = msgp.AppendString(dst, BlockRemoved.String())
		dst = appendHashes(dst, ev.BlockHashes, s.Hashes)
		return appendMedium(dst, ev.Medium, s)
	default:
		dst = msgp.AppendArrayHeader(dst, 1)
		return msgp.AppendString(dst, ev.Kind.String())
	}
}

func appendNilPerBlock(dst []byte, n int) []byte {
	dst = msgp.AppendArrayHeader(dst, uint32(n))
	for range n {
		dst = msgp.AppendNil(dst)
	}
	return dst
}

func appendHash(dst []byte, h EngineHash, f HashForm) []byte {
	if f == HashDigest32 {
		d := Digest32(h)
		return msgp.AppendBytes(dst, d[:])
	}
	if !h.IsInt() {
		var raw [16]byte
		binary.BigEndian.PutUint64(raw[:8], h.Hi)
		binary.BigEndian.PutUint64(raw[8:], h.Lo)
		return msgp.AppendBytes(dst, raw[:])
	}
	switch f {
	case HashInt64:
		return msgp.AppendInt64(dst, int64(h.Lo))
	case HashBytes8:
		var raw [8]byte
		binary.BigEndian.PutUint64(raw[:], h.Lo)
		return msgp.AppendBytes(dst, raw[:])
	default:
		return msgp.AppendUint64(dst, h.Lo)
	}
}

func appendHashes(dst []byte, hs []EngineHash, f HashForm) []byte {
	dst = msgp.AppendArrayHeader(dst, uint32(len(hs)))
	for _, h := range hs {
		dst = appendHash(dst, h, f)
	}
	return dst
}

func appendParent(dst []byte, ev *Event, f HashForm, zeroRoot bool) []byte {
	switch {
	case ev.HasParent:
		return appendHash(dst, ev.ParentHash, f)
	case zeroRoot:
		return msgp.AppendInt(dst, 0)
	}
	return msgp.AppendNil(dst)
}

// appendTokens writes ts as an array of the shortest MessagePack
// unsigned integers (positive fixint, uint8, uint16 or uint32), as
// msgp.AppendUint32 writes each. Real text's ids change width at random,
// so the width is chosen without a branch and every id is one 8-byte
// store into room made once: c is the width's class, which picks the
// type byte and how far the byte-reversed id moves (a fixint is written
// as a uint8 whose type byte shifts out).
func appendTokens(dst []byte, ts []uint32) []byte {
	dst = msgp.AppendArrayHeader(dst, uint32(len(ts)))
	n := len(dst)
	room := n + 5*len(ts) + 8
	dst = slices.Grow(dst, room-n)[:room]
	for _, v := range ts {
		x := uint64(v)
		over7, over16 := b2u(x > 0x7f), b2u(x > 0xffff)
		c := over7 + b2u(x > 0xff) + over16
		// Shift counts masked to 63 (none is larger) spare the compiler's
		// check for counts of 64 and more.
		typ := uint64(0xcecdcc00) >> (8 * c & 63) & 0xff
		value := uint64(bits.ReverseBytes32(v)) >> (uint64(0x00101818) >> (8 * c & 63) & 63)
		binary.LittleEndian.PutUint64(dst[n:], (typ|value<<8)>>((8-8*over7)&63))
		n += int(1 + c + over16)
	}
	return dst[:n]
}

// b2u is 1 for true and 0 for false; the compiler makes it a SETcc.
func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

func appendLoraID(dst []byte, ev *Event) []byte {
	if ev.PlainText {
		return msgp.AppendNil(dst)
	}
	return msgp.AppendInt(dst, nonPlainLoraID)
}

func appendMedium(dst []byte, m Medium, s Shape) []byte {
	name := m.String()
	switch {
	case m == Host && s.PinnedHost:
		name = "CPU_PINNED"
	case s.UpperMedium:
		switch m {
		case Device:
			name = "GPU"
		case Host:
			name = "CPU"
		case Disk:
			name = "DISK"
		case External:
			name = "EXTERNAL"
		default:
			name = "OTHER"
		}
	}
	return msgp.AppendString(dst, name)
}
