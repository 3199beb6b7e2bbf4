package kvevent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/tinylib/msgp/msgp"
)

// DefaultMaxMessageBytes is the max_message_bytes default (8 MiB).
const DefaultMaxMessageBytes = 8 << 20

// minEventBytes is the size of the shortest valid event,
// ["BlockStored", []]: it bounds how many event records a payload can make
// us allocate.
const minEventBytes = 14

// maxField bounds block_size and data_parallel_rank: larger values are
// not real configurations and would only invite overflow further on.
const maxField = math.MaxInt32

// Decoder decodes batch payloads in every shape of R-WIRE-2. It holds no
// per-message state, so one Decoder may serve many goroutines.
type Decoder struct {
	maxMessageBytes int
}

// NewDecoder returns a decoder that rejects payloads longer than
// maxMessageBytes; a non-positive value selects DefaultMaxMessageBytes.
func NewDecoder(maxMessageBytes int) *Decoder {
	if maxMessageBytes <= 0 {
		maxMessageBytes = DefaultMaxMessageBytes
	}
	return &Decoder{maxMessageBytes: maxMessageBytes}
}

// MaxMessageBytes reports the payload size limit.
func (d *Decoder) MaxMessageBytes() int { return d.maxMessageBytes }

// DecodeBatch decodes payload into b, reusing b's storage. Errors wrap
// ErrTooLarge or ErrMalformed; on error b is left empty. The decoded
// slices do not alias payload.
//
// A fault of the decoder itself on some message (a runtime panic) is
// reported as that message being malformed, so that it costs its stream
// a recovery and not the process every other stream lives in; the error
// also wraps ErrDecoderFault and names the fault. The decoder is fuzzed
// not to have any.
func (d *Decoder) DecodeBatch(payload []byte, b *Batch) (err error) {
	b.Reset()
	if len(payload) > d.maxMessageBytes {
		return fmt.Errorf("%w: %d bytes exceeds the limit of %d", ErrTooLarge, len(payload), d.maxMessageBytes)
	}
	defer func() {
		if r := recover(); r != nil {
			// The templates are in whatever state the fault left.
			b.payload, b.tmpl = nil, nil
			b.Reset()
			err = fmt.Errorf("%w: %w on a message of %d bytes: %v", ErrMalformed, ErrDecoderFault, len(payload), r)
		}
	}()
	b.payload = payload
	rest, err := decodeBatch(payload, b)
	b.payload = nil
	if err == nil && len(rest) != 0 {
		err = fmt.Errorf("%d trailing bytes after the batch", len(rest))
	}
	if err != nil {
		b.Reset()
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return nil
}

func typeName(p []byte) string {
	if len(p) == 0 {
		return "end of message"
	}
	return msgp.NextType(p).String()
}

func wrongType(field, want string, p []byte) error {
	return fmt.Errorf("%s: expected %s, got %s", field, want, typeName(p))
}

// readArrayHeader reads an array header and refuses counts that the rest
// of the message cannot hold at minElem bytes per element, so nothing is
// sized from an unchecked claim.
func readArrayHeader(p []byte, field string, minElem int) (int, []byte, error) {
	var (
		sz  uint32
		o   []byte
		err error
	)
	if len(p) > 0 && p[0]&0xf0 == 0x90 { // fixarray, the common case
		sz, o = uint32(p[0]&0x0f), p[1:]
	} else if len(p) > 2 && p[0] == 0xdc { // array 16: a block's token ids
		sz, o = uint32(binary.BigEndian.Uint16(p[1:])), p[3:]
	} else {
		if msgp.NextType(p) != msgp.ArrayType {
			return 0, p, wrongType(field, "array", p)
		}
		if sz, o, err = msgp.ReadArrayHeaderBytes(p); err != nil {
			return 0, p, fmt.Errorf("%s: %w", field, err)
		}
	}
	if uint64(sz)*uint64(minElem) > uint64(len(o)) {
		if minElem > 1 {
			return 0, p, fmt.Errorf("%s: array claims %d elements of at least %d bytes but only %d bytes remain", field, sz, minElem, len(o))
		}
		return 0, p, fmt.Errorf("%s: array claims %d elements but only %d bytes remain", field, sz, len(o))
	}
	return int(sz), o, nil
}

func readMapHeader(p []byte, field string) (int, []byte, error) {
	var (
		sz  uint32
		o   []byte
		err error
	)
	if len(p) > 0 && p[0]&0xf0 == 0x80 { // fixmap
		sz, o = uint32(p[0]&0x0f), p[1:]
	} else {
		if msgp.NextType(p) != msgp.MapType {
			return 0, p, wrongType(field, "map", p)
		}
		if sz, o, err = msgp.ReadMapHeaderBytes(p); err != nil {
			return 0, p, fmt.Errorf("%s: %w", field, err)
		}
	}
	if uint64(sz)*2 > uint64(len(o)) {
		return 0, p, fmt.Errorf("%s: map claims %d entries but only %d bytes remain", field, sz, len(o))
	}
	return int(sz), o, nil
}

// readStr reads a str value without copying it.
func readStr(p []byte, field string) ([]byte, []byte, error) {
	if len(p) > 0 && p[0]&0xe0 == 0xa0 { // fixstr: every key and tag engines send
		if n := int(p[0] & 0x1f); len(p) > n {
			return p[1 : 1+n], p[1+n:], nil
		}
	}
	if msgp.NextType(p) != msgp.StrType {
		return nil, p, wrongType(field, "str", p)
	}
	v, o, err := msgp.ReadStringZC(p)
	if err != nil {
		return nil, p, fmt.Errorf("%s: %w", field, err)
	}
	return v, o, nil
}

// skip passes over one value of any type. field must be a constant: a
// name built per call would allocate on the success path too.
func skip(p []byte, field string) ([]byte, error) {
	o, err := msgp.Skip(p)
	if err != nil {
		return p, fmt.Errorf("%s: %w", field, err)
	}
	return o, nil
}

func readNumber(p []byte, field string) (float64, []byte, error) {
	switch msgp.NextType(p) {
	case msgp.Float64Type, msgp.Float32Type:
		f, o, err := msgp.ReadFloat64Bytes(p)
		if err != nil {
			return 0, p, fmt.Errorf("%s: %w", field, err)
		}
		return f, o, nil
	case msgp.IntType:
		i, o, err := msgp.ReadInt64Bytes(p)
		if err != nil {
			return 0, p, fmt.Errorf("%s: %w", field, err)
		}
		return float64(i), o, nil
	case msgp.UintType:
		u, o, err := msgp.ReadUint64Bytes(p)
		if err != nil {
			return 0, p, fmt.Errorf("%s: %w", field, err)
		}
		return float64(u), o, nil
	}
	return 0, p, wrongType(field, "number", p)
}

// readSmallInt reads an integer in [0, maxField].
func readSmallInt(p []byte, field string) (int, []byte, error) {
	if len(p) > 0 && p[0] <= 0x7f {
		return int(p[0]), p[1:], nil
	}
	if len(p) > 1 && p[0] == 0xcc { // uint8: a block size of 128 or more, in every event
		return int(p[1]), p[2:], nil
	}
	switch msgp.NextType(p) {
	case msgp.IntType, msgp.UintType:
	default:
		return 0, p, wrongType(field, "int", p)
	}
	if p[0] == 0xcf { // uint64 above MaxInt64 would not fit ReadInt64Bytes
		u, _, err := msgp.ReadUint64Bytes(p)
		if err != nil {
			return 0, p, fmt.Errorf("%s: %w", field, err)
		}
		if u > maxField {
			return 0, p, fmt.Errorf("%s: %d out of range [0, %d]", field, u, maxField)
		}
	}
	i, o, err := msgp.ReadInt64Bytes(p)
	if err != nil {
		return 0, p, fmt.Errorf("%s: %w", field, err)
	}
	if i < 0 || i > maxField {
		return 0, p, fmt.Errorf("%s: %d out of range [0, %d]", field, i, maxField)
	}
	return int(i), o, nil
}

func decodeBatch(p []byte, b *Batch) ([]byte, error) {
	switch msgp.NextType(p) {
	case msgp.ArrayType:
		return decodeBatchArray(p, b)
	case msgp.MapType:
		return decodeBatchMap(p, b)
	}
	return p, wrongType("batch", "array or map", p)
}

func decodeBatchArray(p []byte, b *Batch) ([]byte, error) {
	n, p, err := readArrayHeader(p, "batch", 1)
	if err != nil {
		return p, err
	}
	if n < 2 {
		return p, fmt.Errorf("batch: array has %d elements, want [ts, events] or [ts, events, dp_rank]", n)
	}
	if b.Timestamp, p, err = readNumber(p, keyTS); err != nil {
		return p, err
	}
	if p, err = decodeEvents(p, b); err != nil {
		return p, err
	}
	if n >= 3 {
		if p, err = decodeDPRank(p, b); err != nil {
			return p, err
		}
	}
	// Later engine versions may append fields; they carry nothing we index.
	for i := 3; i < n; i++ {
		if p, err = msgp.Skip(p); err != nil {
			return p, fmt.Errorf("batch[%d]: %w", i, err)
		}
	}
	return p, nil
}

func decodeBatchMap(p []byte, b *Batch) ([]byte, error) {
	n, p, err := readMapHeader(p, "batch")
	if err != nil {
		return p, err
	}
	seenEvents := false
	for range n {
		var key []byte
		if key, p, err = readStr(p, "batch: key"); err != nil {
			return p, err
		}
		switch string(key) {
		case keyTS:
			b.Timestamp, p, err = readNumber(p, keyTS)
		case keyEvents:
			if seenEvents {
				return p, errors.New("batch: duplicate events key")
			}
			seenEvents = true
			p, err = decodeEvents(p, b)
		case keyDPRank, keyAttnDPRank:
			// vLLM names the rank data_parallel_rank, SGLang attn_dp_rank.
			p, err = decodeDPRank(p, b)
		default:
			if p, err = msgp.Skip(p); err != nil {
				err = fmt.Errorf("batch: %s: %w", key, err)
			}
		}
		if err != nil {
			return p, err
		}
	}
	if !seenEvents {
		return p, errors.New("batch: missing events")
	}
	return p, nil
}

func decodeDPRank(p []byte, b *Batch) ([]byte, error) {
	if msgp.IsNil(p) {
		b.HasDPRank, b.DPRank = false, 0
		return p[1:], nil
	}
	r, o, err := readSmallInt(p, keyDPRank)
	if err != nil {
		return p, err
	}
	b.HasDPRank, b.DPRank = true, r
	return o, nil
}

func decodeEvents(p []byte, b *Batch) ([]byte, error) {
	n, p, err := readArrayHeader(p, keyEvents, minEventBytes)
	if err != nil {
		return p, err
	}
	b.Events = slices.Grow(b.Events[:0], n)[:n]
	var ts *templates
	if n > 1 && !b.generalOnly {
		if b.tmpl == nil {
			b.tmpl = new(templates)
		}
		ts = b.tmpl
		defer ts.reset()
	}
	for i := range b.Events {
		ev := &b.Events[i]
		if ts != nil {
			var ok bool
			if p, ok = ts.decode(p, b, ev); ok {
				continue
			}
		}
		at := p
		if p, err = decodeEvent(p, b, ev); err != nil {
			return p, fmt.Errorf("event %d: %w", i, err)
		}
		if ts != nil {
			ts.learn(at[:len(at)-len(p)], ev, b.tokensRest-len(p))
		}
	}
	return p, nil
}

// field identifies an event field independently of the event's shape, so
// map and array events share one field decoder. The order up to
// fieldLocality is the position of each field in an array BlockStored
// (vLLM's array_like structs, ending with kv_cache_spec_sliding_window
// and locality); arrayField depends on it.
type field uint8

const (
	fieldHashes field = iota
	fieldParent
	fieldTokens
	fieldBlockSize
	fieldLoraID
	fieldMedium
	// fieldLoraName is lora_name in vLLM's arrays and SGLang's metadata
	// map {"cache_salt": ...} in its older arrays.
	fieldLoraName
	fieldExtraKeys
	fieldGroupIdx
	fieldSpecKind
	fieldSlidingWindow
	fieldLocality
	fieldCacheSalt
	fieldUnknown
)

// arrayField maps position i (after the type tag) of an array event to
// its field. Positions past the known fields are skipped.
func arrayField(k Kind, i int) field {
	switch k {
	case BlockStored:
		if i <= int(fieldLocality) {
			return field(i)
		}
	case BlockRemoved:
		switch i {
		case 0:
			return fieldHashes
		case 1:
			return fieldMedium
		case 2:
			return fieldGroupIdx
		case 3:
			return fieldLocality
		}
	}
	return fieldUnknown
}

func fieldOfKey(key []byte) field {
	switch string(key) {
	case keyBlockHashes:
		return fieldHashes
	case keyParent:
		return fieldParent
	case keyTokenIDs:
		return fieldTokens
	case keyBlockSize:
		return fieldBlockSize
	case keyLoraID:
		return fieldLoraID
	case keyMedium:
		return fieldMedium
	case keyLoraName:
		return fieldLoraName
	case keyExtraKeys:
		return fieldExtraKeys
	case keyGroupIdx:
		return fieldGroupIdx
	case keySpecKind:
		return fieldSpecKind
	case keyLocality:
		return fieldLocality
	case keyCacheSalt:
		return fieldCacheSalt
	}
	// kv_cache_spec_sliding_window, ownership, session_id and keys of
	// later versions carry nothing the index needs.
	return fieldUnknown
}

func fieldName(f field) string {
	switch f {
	case fieldHashes:
		return keyBlockHashes
	case fieldParent:
		return keyParent
	case fieldTokens:
		return keyTokenIDs
	case fieldBlockSize:
		return keyBlockSize
	case fieldLoraID:
		return keyLoraID
	case fieldMedium:
		return keyMedium
	case fieldLoraName:
		return keyLoraName
	case fieldExtraKeys:
		return keyExtraKeys
	case fieldGroupIdx:
		return keyGroupIdx
	case fieldSpecKind:
		return keySpecKind
	case fieldSlidingWindow:
		return "kv_cache_spec_sliding_window"
	case fieldLocality:
		return keyLocality
	case fieldCacheSalt:
		return keyCacheSalt
	}
	return "unknown field"
}

func readKind(p []byte) (Kind, []byte, error) {
	s, o, err := readStr(p, keyType)
	if err != nil {
		return 0, p, err
	}
	switch string(s) {
	case "BlockStored":
		return BlockStored, o, nil
	case "BlockRemoved":
		return BlockRemoved, o, nil
	case "AllBlocksCleared":
		return AllBlocksCleared, o, nil
	}
	return 0, p, fmt.Errorf("%s: unknown event type %q", keyType, s)
}

func decodeEvent(p []byte, b *Batch, ev *Event) ([]byte, error) {
	*ev = Event{PlainText: true}
	var (
		hasHashes bool
		err       error
	)
	switch msgp.NextType(p) {
	case msgp.MapType:
		var n int
		if n, p, err = readMapHeader(p, "event"); err != nil {
			return p, err
		}
		for range n {
			var key []byte
			if len(p) > 0 && p[0]&0xe0 == 0xa0 && len(p) > int(p[0]&0x1f) {
				// fixstr key inline: this loop runs seven times per event
				k := int(p[0] & 0x1f)
				key, p = p[1:1+k], p[1+k:]
			} else if key, p, err = readStr(p, "event: key"); err != nil {
				return p, err
			}
			if string(key) == keyType {
				ev.Kind, p, err = readKind(p)
			} else if f := fieldOfKey(key); f == fieldUnknown {
				if p, err = msgp.Skip(p); err != nil {
					err = fmt.Errorf("%s: %w", key, err)
				}
			} else {
				hasHashes = hasHashes || f == fieldHashes
				p, err = decodeField(p, f, b, ev, false)
			}
			if err != nil {
				return p, err
			}
		}
		if ev.Kind == 0 {
			return p, errors.New("missing type")
		}
	case msgp.ArrayType:
		var n int
		if n, p, err = readArrayHeader(p, "event", 1); err != nil {
			return p, err
		}
		if n == 0 {
			return p, errors.New("empty array, want a type tag first")
		}
		if ev.Kind, p, err = readKind(p); err != nil {
			return p, err
		}
		for i := 1; i < n; i++ {
			if f := arrayField(ev.Kind, i-1); f != fieldUnknown {
				hasHashes = hasHashes || f == fieldHashes
				p, err = decodeField(p, f, b, ev, true)
			} else if p, err = msgp.Skip(p); err != nil {
				err = fmt.Errorf("element %d: %w", i, err)
			}
			if err != nil {
				return p, err
			}
		}
	default:
		return p, wrongType("event", "map or array", p)
	}
	return p, finishEvent(ev, hasHashes)
}

// finishEvent checks the cross-field rules and clears fields that do not
// belong to the event's kind, so consumers see one normal form whatever
// the shape.
func finishEvent(ev *Event, hasHashes bool) error {
	switch ev.Kind {
	case BlockStored:
		if !hasHashes {
			return fmt.Errorf("%s: missing", keyBlockHashes)
		}
		if nt := len(ev.TokenIDs); nt > 0 {
			bs := ev.BlockSize
			if bs <= 0 {
				return fmt.Errorf("%s: %d with %d tokens, want > 0", keyBlockSize, bs, nt)
			}
			if nt%bs != 0 || nt/bs != len(ev.BlockHashes) {
				return fmt.Errorf("%s: %d tokens for %d blocks of %d", keyTokenIDs, nt, len(ev.BlockHashes), bs)
			}
		}
	case BlockRemoved:
		if !hasHashes {
			return fmt.Errorf("%s: missing", keyBlockHashes)
		}
		*ev = Event{Kind: BlockRemoved, Medium: ev.Medium, BlockHashes: ev.BlockHashes, PlainText: true}
	case AllBlocksCleared:
		*ev = Event{Kind: AllBlocksCleared, PlainText: true}
	}
	return nil
}

// decodeField decodes one field into ev. inArray is true for the legacy
// array events, whose encoders wrote a root's parent as 0.
func decodeField(p []byte, f field, b *Batch, ev *Event, inArray bool) ([]byte, error) {
	var (
		err error
		ctx bool
	)
	switch f {
	case fieldHashes:
		ev.BlockHashes, p, err = readHashes(p, b)
	case fieldParent:
		if msgp.IsNil(p) {
			ev.HasParent, ev.ParentHash = false, EngineHash{}
			return p[1:], nil
		}
		var h EngineHash
		if h, p, err = readHash(p); err != nil {
			return p, fmt.Errorf("%s: %w", keyParent, err)
		}
		// A legacy array encoder sends 0 for "no parent"; an engine hash
		// that is exactly 0 is a 2^-64 event. In maps nil is the only
		// root and 0 is taken as a hash.
		if inArray && h == (EngineHash{}) {
			ev.HasParent, ev.ParentHash = false, EngineHash{}
			return p, nil
		}
		ev.ParentHash, ev.HasParent = h, true
	case fieldTokens:
		ev.TokenIDs, ctx, p, err = readTokens(p, b)
		b.tokensRest = len(p)
	case fieldBlockSize:
		ev.BlockSize, p, err = readSmallInt(p, keyBlockSize)
	case fieldLoraID:
		if msgp.IsNil(p) {
			return p[1:], nil
		}
		ctx = true
		p, err = skip(p, keyLoraID)
	case fieldMedium:
		ev.Medium, p, err = readMedium(p)
	case fieldLoraName:
		ctx, p, err = readLoraName(p)
	case fieldExtraKeys:
		ctx, p, err = readExtraKeys(p)
	case fieldGroupIdx:
		ctx, p, err = readGroupIdx(p)
	case fieldSpecKind:
		ctx, p, err = readStrIs(p, keySpecKind, specFullAttention)
	case fieldLocality:
		ctx, p, err = readStrIs(p, keyLocality, localityLocal)
	case fieldCacheSalt:
		ctx, p, err = readNonEmpty(p, keyCacheSalt)
	default:
		p, err = skip(p, fieldName(f))
	}
	if ctx {
		ev.PlainText = false
	}
	return p, err
}

// readMedium maps a medium string to its tier, ignoring case (engines
// write "GPU", the seed's engine "gpu"). Unknown strings are OtherMedium,
// which is never a hit: a new tier name costs hits, not correctness.
func readMedium(p []byte) (Medium, []byte, error) {
	if msgp.IsNil(p) {
		return Device, p[1:], nil
	}
	if msgp.NextType(p) != msgp.StrType {
		return 0, p, wrongType(keyMedium, "str or nil", p)
	}
	s, o, err := readStr(p, keyMedium)
	if err != nil {
		return 0, p, err
	}
	return MediumOf(s), o, nil
}

// MediumOf maps a medium name, in any case, to its tier: "" and the
// device names to Device, host memory names to Host, local storage to
// Disk, shared or remote pools to External, anything else to OtherMedium.
func MediumOf(s []byte) Medium {
	// Through a pointer: ranging over the array's value copies it first,
	// 400 bytes for every event.
	for _, m := range &mediumNames {
		if asciiEqualFold(s, m.name) {
			return m.medium
		}
	}
	return OtherMedium
}

// mediumNames lists the names vLLM, SGLang, llm-d and Dynamo use. Host is
// host memory an engine loads back from quickly (pinned or first-tier
// CPU memory); CPU_TIER2 is SGLang's storage tier below it.
var mediumNames = [...]struct {
	name   string
	medium Medium
}{
	{"gpu", Device}, {"", Device}, {"cpu", Host}, {"device", Device}, {"hbm", Device},
	{"cpu_pinned", Host}, {"cpu_tier1", Host}, {"host", Host},
	{"cpu_tier2", Disk}, {"disk", Disk}, {"nvme", Disk}, {"storage", Disk}, {"ssd", Disk},
	{"external", External}, {"network", External}, {"remote", External}, {"shared", External},
}

// asciiEqualFold compares s with lower, which is ASCII lower case,
// ignoring the case of s.
func asciiEqualFold(s []byte, lower string) bool {
	if len(s) != len(lower) {
		return false
	}
	for i := range len(s) {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// readLoraName reports whether a lora_name carries LoRA context: any
// non-nil value except the empty string does. SGLang's older arrays hold
// a metadata map at this position instead, read by readMetadata.
func readLoraName(p []byte) (bool, []byte, error) {
	if msgp.IsNil(p) {
		return false, p[1:], nil
	}
	switch msgp.NextType(p) {
	case msgp.StrType:
		s, o, err := msgp.ReadStringZC(p)
		if err != nil {
			return false, p, fmt.Errorf("%s: %w", keyLoraName, err)
		}
		return len(s) > 0, o, nil
	case msgp.MapType:
		return readMetadata(p)
	}
	o, err := skip(p, keyLoraName)
	return true, o, err
}

// readMetadata reads SGLang's positional metadata map: a cache_salt,
// lora_name or extra_keys in it is context; other keys are ignored.
func readMetadata(p []byte) (bool, []byte, error) {
	const field = "metadata"
	n, p, err := readMapHeader(p, field)
	if err != nil {
		return false, p, err
	}
	ctx := false
	for range n {
		var key []byte
		if key, p, err = readStr(p, "metadata: key"); err != nil {
			return false, p, err
		}
		var c bool
		switch string(key) {
		case keyCacheSalt:
			c, p, err = readNonEmpty(p, keyCacheSalt)
		case keyLoraName:
			c, p, err = readNonEmpty(p, keyLoraName)
		case keyExtraKeys:
			c, p, err = readExtraKeys(p)
		default:
			p, err = skip(p, field)
		}
		if err != nil {
			return false, p, err
		}
		ctx = ctx || c
	}
	return ctx, p, nil
}

// readNonEmpty reports whether a value is context: anything but nil and
// the empty string or bytes.
func readNonEmpty(p []byte, field string) (bool, []byte, error) {
	var (
		v   []byte
		o   []byte
		err error
	)
	switch msgp.NextType(p) {
	case msgp.NilType:
		return false, p[1:], nil
	case msgp.StrType:
		v, o, err = msgp.ReadStringZC(p)
	case msgp.BinType:
		v, o, err = msgp.ReadBytesZC(p)
	default:
		o, err = skip(p, field)
		return true, o, err
	}
	if err != nil {
		return false, p, fmt.Errorf("%s: %w", field, err)
	}
	return len(v) > 0, o, nil
}

// readStrIs reports whether a value is context: a string other than
// want (ASCII lower case; the value's case is ignored) or a value that is
// not a string. nil is the default and is not.
func readStrIs(p []byte, field, want string) (bool, []byte, error) {
	if msgp.IsNil(p) {
		return false, p[1:], nil
	}
	if msgp.NextType(p) == msgp.StrType {
		s, o, err := readStr(p, field)
		if err != nil {
			return false, p, err
		}
		return !asciiEqualFold(s, want), o, nil
	}
	o, err := skip(p, field)
	return true, o, err
}

// readGroupIdx reports whether a KV cache group index is context: group
// 0 (or nil) is the model's main group; any other group, or a value that
// is not an integer, is not a plain prefix of full attention KV.
func readGroupIdx(p []byte) (bool, []byte, error) {
	switch msgp.NextType(p) {
	case msgp.NilType:
		return false, p[1:], nil
	case msgp.IntType, msgp.UintType:
		if p[0] == 0x00 {
			return false, p[1:], nil
		}
		if p[0] != 0xcf { // a uint64 is never 0 in a shortest encoding, but may not fit int64
			v, o, err := msgp.ReadInt64Bytes(p)
			if err != nil {
				return false, p, fmt.Errorf("%s: %w", keyGroupIdx, err)
			}
			return v != 0, o, nil
		}
	}
	o, err := skip(p, keyGroupIdx)
	return true, o, err
}

// readExtraKeys reports whether extra_keys carries context. It is a list
// with one entry per block (vLLM sends [None] per block for plain text);
// an entry that is nil or an empty tuple names no key, so only a list
// with some other entry makes the event non-plain. Any other non-nil
// value is taken as context to stay on the safe side of R-WIRE-5.
func readExtraKeys(p []byte) (bool, []byte, error) {
	if msgp.IsNil(p) {
		return false, p[1:], nil
	}
	if msgp.NextType(p) != msgp.ArrayType {
		o, err := skip(p, keyExtraKeys)
		return true, o, err
	}
	n, p, err := readArrayHeader(p, keyExtraKeys, 1)
	if err != nil {
		return false, p, err
	}
	ctx := false
	for range n {
		if len(p) == 0 {
			return false, p, fmt.Errorf("%s: %w", keyExtraKeys, msgp.ErrShortBytes)
		}
		if c := p[0]; c == 0xc0 || c == 0x90 { // nil or []
			p = p[1:]
			continue
		}
		ctx = true
		if p, err = skip(p, keyExtraKeys); err != nil {
			return false, p, err
		}
	}
	return ctx, p, nil
}

func readHashes(p []byte, b *Batch) ([]EngineHash, []byte, error) {
	n, p, err := readArrayHeader(p, keyBlockHashes, 1)
	if err != nil {
		return nil, p, err
	}
	start := len(b.hashes)
	b.hashes = slices.Grow(b.hashes, n)[:start+n]
	dst := b.hashes[start : start+n : start+n]
	for i := range dst {
		if dst[i], p, err = readHash(p); err != nil {
			return nil, p, fmt.Errorf("%s[%d]: %w", keyBlockHashes, i, err)
		}
	}
	return dst, p, nil
}

// readHash reads one engine hash: any msgpack integer, keeping its 64-bit
// pattern, or a bin/str reduced by BytesHash. Callers name the field in
// errors.
func readHash(p []byte) (EngineHash, []byte, error) {
	if len(p) == 0 {
		return EngineHash{}, p, msgp.ErrShortBytes
	}
	c := p[0]
	switch {
	case c <= 0x7f:
		return IntHash(uint64(c)), p[1:], nil
	case c >= 0xe0:
		return IntHash(uint64(int64(int8(c)))), p[1:], nil
	}
	var need int
	switch c {
	case 0xcc, 0xd0:
		need = 2
	case 0xcd, 0xd1:
		need = 3
	case 0xce, 0xd2:
		need = 5
	case 0xcf, 0xd3:
		need = 9
	default:
		switch msgp.NextType(p) {
		case msgp.BinType:
			v, o, err := msgp.ReadBytesZC(p)
			if err != nil {
				return EngineHash{}, p, err
			}
			return BytesHash(v), o, nil
		case msgp.StrType:
			v, o, err := msgp.ReadStringZC(p)
			if err != nil {
				return EngineHash{}, p, err
			}
			return BytesHash(v), o, nil
		}
		return EngineHash{}, p, fmt.Errorf("expected int or bytes, got %s", typeName(p))
	}
	if len(p) < need {
		return EngineHash{}, p, msgp.ErrShortBytes
	}
	var h uint64
	switch c {
	case 0xcc:
		h = uint64(p[1])
	case 0xcd:
		h = uint64(binary.BigEndian.Uint16(p[1:]))
	case 0xce:
		h = uint64(binary.BigEndian.Uint32(p[1:]))
	case 0xcf, 0xd3:
		h = binary.BigEndian.Uint64(p[1:])
	case 0xd0:
		h = uint64(int64(int8(p[1])))
	case 0xd1:
		h = uint64(int64(int16(binary.BigEndian.Uint16(p[1:]))))
	case 0xd2:
		h = uint64(int64(int32(binary.BigEndian.Uint32(p[1:]))))
	}
	return IntHash(h), p[need:], nil
}

// readTokens reads a token_ids array: readIDs reads the encodings
// engines actually produce (positive fixint, uint8, uint16, uint32) for
// as long as it can, and the loop reads the rest, the last few ids of a
// message and everything else. ctx reports a token that is not a plain
// integer (SGLang's speculative decoding sends token pairs): the blocks
// are then not plain text, and the token's place is held by 0 so the
// count still checks.
func readTokens(p []byte, b *Batch) (dst []uint32, ctx bool, rest []byte, err error) {
	n, p, err := readArrayHeader(p, keyTokenIDs, 1)
	if err != nil {
		return nil, false, p, err
	}
	start := len(b.tokens)
	b.tokens = slices.Grow(b.tokens, n)[:start+n]
	dst = b.tokens[start : start+n : start+n]
	if b.walk == nil {
		b.walk = new(walkScratch)
	}
	var i int
	if at := len(b.payload) - len(p); at >= 8 && len(p) > 0 && &b.payload[at] == &p[0] {
		// p is the end of the message being decoded, whose bytes before
		// the array let the walk start at its first id.
		i, at = readIDsAt(b.payload, at, dst, b.walk)
		p = b.payload[at:]
	} else {
		i, p = readIDs(p, dst, b.walk)
	}
	if ctx, p, err = readEachToken(p, dst, i); err != nil {
		return nil, false, p, err
	}
	return dst, ctx, p, nil
}

// readEachToken reads token ids dst[i:] from p one at a time, with a
// branch on each id's encoding: the ids readIDs leaves, and any other
// encoding readTokens accepts.
func readEachToken(p []byte, dst []uint32, i int) (ctx bool, rest []byte, err error) {
	for ; i < len(dst); i++ {
		if id, size := readPlainID(p); size > 0 {
			dst[i], p = id, p[size:]
			continue
		}
		if msgp.NextType(p) == msgp.ArrayType {
			dst[i], ctx = 0, true
			if p, err = skip(p, keyTokenIDs); err != nil {
				return false, p, err
			}
			continue
		}
		if dst[i], p, err = readTokenSlow(p); err != nil {
			return false, p, fmt.Errorf("%s[%d]: %w", keyTokenIDs, i, err)
		}
	}
	return ctx, p, nil
}

// readTokenSlow reads one token id in any integer encoding, range-checked,
// and reports everything else. It serves the rare encodings (uint64 and
// the signed forms) and the last few bytes of a message.
func readTokenSlow(p []byte) (uint32, []byte, error) {
	switch msgp.NextType(p) {
	case msgp.UintType:
		u, o, err := msgp.ReadUint64Bytes(p)
		if err != nil {
			return 0, p, err
		}
		if u > math.MaxUint32 {
			return 0, p, fmt.Errorf("%d out of range [0, 2^32)", u)
		}
		return uint32(u), o, nil
	case msgp.IntType:
		i, o, err := msgp.ReadInt64Bytes(p)
		if err != nil {
			return 0, p, err
		}
		if i < 0 || i > math.MaxUint32 {
			return 0, p, fmt.Errorf("%d out of range [0, 2^32)", i)
		}
		return uint32(i), o, nil
	}
	return 0, p, fmt.Errorf("expected int, got %s", typeName(p))
}
