package baidustd

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"

	"google.golang.org/protobuf/proto"

	"github.com/kvcar/kvcar/internal/baidustd/metapb"
	"github.com/kvcar/kvcar/internal/budget"
)

// HeaderSize is the size of a frame header: "PRPC", body_size, meta_size.
const HeaderSize = 12

// Magic starts every baidu_std frame; brpc tells baidu_std from the other
// protocols on a port by it.
const Magic = "PRPC"

// DefaultMaxBodySize is brpc's default -max_body_size, 64 MiB.
const DefaultMaxBodySize = 64 << 20

// Frame is one decoded frame. Payload is the message followed by the
// attachment; it aliases the buffer the frame was read from.
type Frame struct {
	Meta    *metapb.RpcMeta
	Payload []byte
}

// Parts splits the payload into the message and the attachment that
// RpcMeta.attachment_size announces. ok is false when attachment_size is
// negative or larger than the payload.
func (f Frame) Parts() (msg, att []byte, ok bool) {
	n := int64(f.Meta.GetAttachmentSize())
	if n < 0 || n > int64(len(f.Payload)) {
		return nil, nil, false
	}
	cut := len(f.Payload) - int(n)
	return f.Payload[:cut:cut], f.Payload[cut:], true
}

// IsMagic reports whether b starts like a baidu_std frame: the first
// min(len(b), 4) bytes agree with "PRPC".
func IsMagic(b []byte) bool {
	n := min(len(b), len(Magic))
	return string(b[:n]) == Magic[:n]
}

// ParseHeader checks a frame header and returns its body and meta sizes.
// The error is a *FrameError: bad magic, body_size over maxBody, or
// meta_size over body_size.
func ParseHeader(h []byte, maxBody uint32) (body, meta uint32, err error) {
	if len(h) < HeaderSize {
		return 0, 0, io.ErrUnexpectedEOF
	}
	if string(h[:4]) != Magic {
		return 0, 0, frameErrorf("magic %q is not %q", h[:4], Magic)
	}
	body = binary.BigEndian.Uint32(h[4:8])
	meta = binary.BigEndian.Uint32(h[8:12])
	if body > maxBody {
		return 0, 0, frameErrorf("body_size=%d is larger than the limit %d", body, maxBody)
	}
	if meta > body {
		return 0, 0, frameErrorf("meta_size=%d is bigger than body_size=%d", meta, body)
	}
	return body, meta, nil
}

// DecodeMeta parses an RpcMeta as brpc does: every required field of
// RpcRequestMeta must be present. The error is a *FrameError.
func DecodeMeta(b []byte, m *metapb.RpcMeta) error {
	if err := proto.Unmarshal(b, m); err != nil {
		return frameErrorf("RpcMeta does not parse: %v", err)
	}
	return nil
}

// ParseFrame decodes the frame at the start of b and returns it with the
// number of bytes it takes. A b shorter than the frame gives
// io.ErrUnexpectedEOF; a frame that breaks the framing gives a
// *FrameError.
func ParseFrame(b []byte, maxBody uint32) (Frame, int, error) {
	body, metaSize, err := ParseHeader(b, maxBody)
	if err != nil {
		return Frame{}, 0, err
	}
	end := HeaderSize + int(body)
	if len(b) < end {
		return Frame{}, 0, io.ErrUnexpectedEOF
	}
	f := Frame{Meta: &metapb.RpcMeta{}}
	metaEnd := HeaderSize + int(metaSize)
	if err := DecodeMeta(b[HeaderSize:metaEnd], f.Meta); err != nil {
		return Frame{}, 0, err
	}
	f.Payload = b[metaEnd:end:end]
	return f, end, nil
}

// ReadFrame reads one frame from r into a buffer of its own. The buffer
// grows as the body arrives, never past the body_size that passed
// ParseHeader: a peer cannot make it hold more than maxBody, nor more
// than it has sent and a first chunk.
func ReadFrame(r *bufio.Reader, maxBody uint32) (Frame, error) {
	f, _, err := readFrame(r, maxBody, nil)
	return f, err
}

// firstChunk is the most a frame's buffer starts with: a larger body is
// read into a buffer that doubles as it arrives, so a header announcing
// 64 MiB costs nothing until the bytes come.
const firstChunk = 64 << 10

// maxLooseMeta is the largest RpcMeta read outside the budget, to answer
// a call the budget refused (a meta is tens of bytes).
const maxLooseMeta = 4 << 10

// overBudget is a frame whose bytes b did not fit: it was read to its
// end and dropped, and meta says which call to refuse.
type overBudget struct {
	meta *metapb.RpcMeta
	body uint32
}

func (e *overBudget) Error() string {
	return fmt.Sprintf("baidu_std: a frame of %d bytes does not fit the in-flight budget", e.body)
}

// readFrame is ReadFrame taking every growth of the frame's buffer from
// b before making it; held is what it took, for the caller to give back
// once the frame is no longer used. On any error it holds nothing. When b
// refuses, the rest of the body is read and dropped and the error is an
// *overBudget, unless the meta neither was read nor is small enough to
// read anyway, which is a *FrameError.
func readFrame(r *bufio.Reader, maxBody uint32, b *budget.Bytes) (f Frame, held int64, err error) {
	var h [HeaderSize]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return Frame{}, 0, err
	}
	body, metaSize, err := ParseHeader(h[:], maxBody)
	if err != nil {
		return Frame{}, 0, err
	}
	var buf []byte
	for len(buf) < int(body) {
		var ok bool
		if buf, ok = grow(buf, firstChunk, int(body), b, &held); !ok {
			b.Give(held)
			return Frame{}, 0, dropFrame(r, buf, body, metaSize)
		}
		if _, err := io.ReadFull(r, buf[len(buf):cap(buf)]); err != nil {
			b.Give(held)
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return Frame{}, 0, err
		}
		buf = buf[:cap(buf)]
	}
	// What the meta decodes to is taken from b too: its user_fields, a
	// map, decode to ten times their wire bytes, so metas within the
	// budget would otherwise take many times it once decoded.
	c := metaCost.of(buf[:metaSize])
	if !b.Take(c) {
		b.Give(held)
		if metaSize > maxLooseMeta {
			return Frame{}, 0, frameErrorf("an RpcMeta of %d bytes, which may decode to %d, does not fit the in-flight budget", metaSize, c)
		}
		// Small enough to decode anyway, to answer the call.
		return Frame{}, 0, dropFrame(r, buf, body, metaSize)
	}
	held += c
	f = Frame{Meta: &metapb.RpcMeta{}, Payload: buf[metaSize:]}
	if err := DecodeMeta(buf[:metaSize], f.Meta); err != nil {
		b.Give(held)
		return Frame{}, 0, err
	}
	return f, held, nil
}

// metaCost bounds what an RpcMeta decodes to; made once, never changed.
var metaCost = newDecodeCost((&metapb.RpcMeta{}).ProtoReflect().Descriptor())

// grow returns buf, its bytes kept, with room for twice its room or
// first bytes, whichever is more, but at most limit (which must exceed
// its room). The added room is taken from b first and added to *held;
// when b refuses it, grow returns buf as it was and false.
func grow(buf []byte, first, limit int, b *budget.Bytes, held *int64) ([]byte, bool) {
	next := min(limit, max(2*cap(buf), first))
	if !b.Take(int64(next - cap(buf))) {
		return buf, false
	}
	*held += int64(next - cap(buf))
	return append(make([]byte, 0, next), buf...), true
}

// dropFrame reads and drops the rest of a frame of which buf has been
// read, keeping only its meta for the *overBudget it returns.
func dropFrame(r *bufio.Reader, buf []byte, body, metaSize uint32) error {
	if int(metaSize) > len(buf) {
		if metaSize > maxLooseMeta {
			return frameErrorf("an RpcMeta of %d bytes does not fit the in-flight budget", metaSize)
		}
		m := make([]byte, metaSize)
		copy(m, buf)
		if _, err := io.ReadFull(r, m[len(buf):]); err != nil {
			return err
		}
		buf = m
	}
	meta := &metapb.RpcMeta{}
	if err := DecodeMeta(buf[:metaSize], meta); err != nil {
		return err
	}
	if _, err := r.Discard(int(body) - len(buf)); err != nil {
		return err
	}
	return &overBudget{meta: meta, body: body}
}

// AppendFrame appends a whole frame to dst: the header, meta, msg and
// att. It sets meta.attachment_size to len(att) when att is not empty
// and clears it otherwise, as brpc sets it only for an attachment.
func AppendFrame(dst []byte, meta *metapb.RpcMeta, msg, att []byte) ([]byte, error) {
	dst, err := appendHead(dst, meta, len(msg), len(att))
	if err != nil {
		return dst, err
	}
	dst = append(dst, msg...)
	return append(dst, att...), nil
}

// appendHead appends the header and meta of a frame whose message and
// attachment, of msgLen and attLen bytes, follow them.
func appendHead(dst []byte, meta *metapb.RpcMeta, msgLen, attLen int) ([]byte, error) {
	if attLen > 0 {
		if attLen > math.MaxInt32 {
			return dst, fmt.Errorf("baidu_std: attachment of %d bytes is too large", attLen)
		}
		meta.AttachmentSize = proto.Int32(int32(attLen))
	} else {
		meta.AttachmentSize = nil
	}
	start := len(dst)
	dst = append(dst, Magic...)
	dst = append(dst, 0, 0, 0, 0, 0, 0, 0, 0)
	var err error
	dst, err = proto.MarshalOptions{Deterministic: true}.MarshalAppend(dst, meta)
	if err != nil {
		return dst[:start], fmt.Errorf("baidu_std: encoding RpcMeta: %w", err)
	}
	metaSize := len(dst) - start - HeaderSize
	body := uint64(metaSize) + uint64(msgLen) + uint64(attLen)
	if body > math.MaxUint32 {
		return dst[:start], fmt.Errorf("baidu_std: body of %d bytes does not fit a frame", body)
	}
	binary.BigEndian.PutUint32(dst[start+4:], uint32(body))
	binary.BigEndian.PutUint32(dst[start+8:], uint32(metaSize))
	return dst, nil
}
