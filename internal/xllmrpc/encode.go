package xllmrpc

import (
	"encoding/binary"
	"math"
	"slices"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kvcar/kvcar/internal/xllmpb"
)

// Prompt is what a caller has already read of a request's prompt, so that
// the dispatcher copies it once into the xLLM message instead of parsing
// the body again: the prompt text or the messages, and where they are in
// the body.
type Prompt struct {
	// Start and End are the offsets in Request.Body of the value of the
	// "prompt" (completions) or "messages" (chat) member; the other
	// members are read from the body without it.
	Start, End int
	// Count is the number of prompts a completions prompt holds: 1, or
	// the length of a batch, whose first prompt is Text or the token ids.
	Count int
	// Text is a completion's prompt text, decoded from its JSON string;
	// empty when the prompt is token ids.
	Text []byte
	// Messages are a chat's messages, in order.
	Messages []Message
}

// Message is one chat message.
type Message struct {
	// Role and Content are decoded from their JSON strings; the text parts
	// of a content array are joined one per line.
	Role, Content []byte
	// Raw is the message's JSON object when it has members besides role
	// and content (tool_calls, reasoning_content, tool_call_id), read from
	// it; nil otherwise.
	Raw []byte
}

// Field numbers the encoder writes itself: the prompt-sized fields of
// CompletionRequest and ChatRequest (xllmpb/proto/completion.proto,
// chat.proto) and ChatMessage's role and content.
const (
	completionPromptField   protowire.Number = 2
	completionTokenIDsField protowire.Number = 24
	chatMessagesField       protowire.Number = 2
	chatTokenIDsField       protowire.Number = 26
	messageRoleField        protowire.Number = 1
	messageContentField     protowire.Number = 2
)

// Buffers are the storage a request's xLLM message is encoded in. A
// caller that keeps them from one request to the next (Request.Buffers)
// spares the dispatcher allocating them for each, which for a long
// prompt is the size of the prompt. The zero value is ready to use.
type Buffers struct {
	rest   []byte                // the body without its prompt
	small  []byte                // the message without its prompt-sized fields
	msg    []byte                // the whole message
	extras []*xllmpb.ChatMessage // per message, its members besides role and content
}

// Size is about the memory the buffers hold.
func (e *Buffers) Size() int { return cap(e.rest) + cap(e.small) + cap(e.msg) + 8*cap(e.extras) }

// reset forgets the last request's messages, keeping the storage.
func (e *Buffers) reset() {
	clear(e.extras)
	e.extras = e.extras[:0]
}

// encoder is the Buffers of one request being encoded.
type encoder = Buffers

// maxKeptEncoderBytes bounds the buffers the dispatcher keeps for the
// next request, so that one huge prompt does not pin its memory.
const maxKeptEncoderBytes = 1 << 20

var encoders = sync.Pool{New: func() any { return new(Buffers) }}

func getEncoder() *Buffers { return encoders.Get().(*Buffers) }

func putEncoder(e *Buffers) {
	e.reset()
	if e.Size() > maxKeptEncoderBytes || cap(e.extras) > 1<<14 {
		return
	}
	encoders.Put(e)
}

// marshal is how the generated code writes the fields the encoder does
// not: deterministic, so that a request's bytes depend only on it.
var marshal = proto.MarshalOptions{Deterministic: true}

// encodeCompletion writes req's CompletionRequest into e.msg: small (every
// field but prompt and token_ids) with the prompt text and the token ids
// spliced in at their field numbers, in field order as the generated
// code and brpc's C++ write a message, without building a message of the
// prompt first.
func (e *encoder) encodeCompletion(small *xllmpb.CompletionRequest, text []byte, ids []uint32) error {
	var err error
	if e.small, err = marshal.MarshalAppend(e.small[:0], small); err != nil {
		return err
	}
	dst, rest := copyFieldsBelow(e.msg[:0], e.small, completionPromptField)
	if len(text) > 0 { // proto3 leaves an empty string off the wire
		dst = protowire.AppendTag(dst, completionPromptField, protowire.BytesType)
		dst = protowire.AppendBytes(dst, text)
	}
	dst, rest = copyFieldsBelow(dst, rest, completionTokenIDsField)
	dst = appendPackedIDs(dst, completionTokenIDsField, ids)
	e.msg = append(dst, rest...)
	return nil
}

// encodeChat writes the ChatRequest into e.msg as encodeCompletion does,
// with the messages and the token ids spliced into small; e.extras hold
// each message's members besides role and content.
func (e *encoder) encodeChat(small *xllmpb.ChatRequest, msgs []Message, ids []uint32) error {
	var err error
	if e.small, err = marshal.MarshalAppend(e.small[:0], small); err != nil {
		return err
	}
	dst, rest := copyFieldsBelow(e.msg[:0], e.small, chatMessagesField)
	for i, m := range msgs {
		// ChatMessage's role and content are optional: present, even
		// empty, as xllm-service sends them.
		size := protowire.SizeTag(messageRoleField) + protowire.SizeBytes(len(m.Role)) +
			protowire.SizeTag(messageContentField) + protowire.SizeBytes(len(m.Content))
		extra := e.extras[i]
		if extra != nil {
			size += marshal.Size(extra)
		}
		dst = protowire.AppendTag(dst, chatMessagesField, protowire.BytesType)
		dst = protowire.AppendVarint(dst, uint64(size))
		dst = protowire.AppendTag(dst, messageRoleField, protowire.BytesType)
		dst = protowire.AppendBytes(dst, m.Role)
		dst = protowire.AppendTag(dst, messageContentField, protowire.BytesType)
		dst = protowire.AppendBytes(dst, m.Content)
		if extra != nil {
			if dst, err = marshal.MarshalAppend(dst, extra); err != nil {
				return err
			}
		}
	}
	dst, rest = copyFieldsBelow(dst, rest, chatTokenIDsField)
	dst = appendPackedIDs(dst, chatTokenIDsField, ids)
	e.msg = append(dst, rest...)
	return nil
}

// copyFieldsBelow appends the leading fields of the encoded message msg
// whose numbers are below limit and returns the rest of msg. msg is in
// field order, as the generated code writes it.
func copyFieldsBelow(dst, msg []byte, limit protowire.Number) (out, rest []byte) {
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 || num >= limit {
			break
		}
		m := protowire.ConsumeFieldValue(num, typ, msg[n:])
		if m < 0 {
			break
		}
		dst = append(dst, msg[:n+m]...)
		msg = msg[n+m:]
	}
	return dst, msg
}

// checkIDs refuses token ids that xLLM's int32 token_ids cannot carry.
func checkIDs(ids []uint32) error {
	for _, t := range ids {
		if t > math.MaxInt32 {
			return badRequest("token id %d does not fit xLLM's int32 token_ids", t)
		}
	}
	return nil
}

// appendPackedIDs appends ids, all at most math.MaxInt32, as a packed
// repeated int32 field; nothing when there are none.
func appendPackedIDs(dst []byte, num protowire.Number, ids []uint32) []byte {
	if len(ids) == 0 {
		return dst
	}
	dst = protowire.AppendTag(dst, num, protowire.BytesType)
	start := len(dst)
	// Every vocabulary's ids are below 2^21, three bytes at most: the ids
	// are written as such first, after room for the length of the most
	// they can take, which is known only after them. Each id is written
	// as eight bytes, its varint in the low ones, and the next id
	// overwrites the rest: no branch on an id's width, which real token
	// ids make unpredictable (protowire.AppendVarint's loop took 8 ns an
	// id of a 2,048-id prompt in kvcar's profile). Where the processor
	// can, packIDs writes sixteen ids at a time, 64 bytes a store; 64
	// bytes past the last id leave room for the last.
	room := protowire.SizeVarint(uint64(3 * len(ids)))
	n := start + room
	dst = slices.Grow(dst, room+3*len(ids)+64)[:n+3*len(ids)+64]
	rest := ids
	if m := len(ids) &^ 15; m > 0 {
		if w := packIDs(&dst[n], &ids[0], m); w >= 0 {
			n += w
			rest = ids[m:]
		}
	}
	all := uint32(0)
	for _, t := range rest {
		all |= t
		x := uint64(t)
		more1 := (0x7f - x) >> 63   // 1 from 2^7 on: a second byte
		more2 := (0x3fff - x) >> 63 // 1 from 2^14 on: a third
		v := x&0x7f | x<<1&0x7f00 | x<<2&0x7f_0000 | more1<<7 | more2<<15
		binary.LittleEndian.PutUint64(dst[n:], v)
		n += int(1 + more1 + more2)
	}
	if all < 1<<21 {
		size := n - start - room
		if l := protowire.SizeVarint(uint64(size)); l < room {
			copy(dst[start+l:], dst[start+room:n])
			n -= room - l
		}
		protowire.AppendVarint(dst[:start], uint64(size))
		return dst[:n]
	}
	// An id of 2^21 or more, which no vocabulary has: sized first, then
	// written again with protowire, up to five bytes each.
	size := 0
	for _, t := range ids {
		size += protowire.SizeVarint(uint64(t))
	}
	dst = protowire.AppendVarint(dst[:start], uint64(size))
	for _, t := range ids {
		dst = protowire.AppendVarint(dst, uint64(t))
	}
	return dst
}
