package baidustd

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvcar/kvcar/internal/baidustd/metapb"
)

const fuzzMaxBody = 1 << 16

func goldenSeeds(f *testing.F) [][]byte {
	var out [][]byte
	for _, v := range goldenVersions {
		files, _ := filepath.Glob(filepath.Join("testdata", v, "*.bin"))
		for _, p := range files {
			b, err := os.ReadFile(p)
			if err != nil {
				f.Fatal(err)
			}
			out = append(out, b)
		}
	}
	if len(out) == 0 {
		f.Fatal("no golden frames")
	}
	return out
}

// The frame parser never panics, never reads past its input, bounds the
// body, and what it accepts re-encodes to a frame that parses the same;
// the streaming reader agrees with it.
func FuzzParseFrame(f *testing.F) {
	for _, b := range goldenSeeds(f) {
		f.Add(b)
	}
	f.Add([]byte("PRPC\x00\x00\x00\x05\x00\x00\x00\x06"))
	f.Add([]byte("PRPC\xff\xff\xff\xff\x00\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, n, err := ParseFrame(b, fuzzMaxBody)
		sf, serr := ReadFrame(bufio.NewReader(bytes.NewReader(b)), fuzzMaxBody)
		if (err == nil) != (serr == nil) {
			t.Fatalf("ParseFrame %v, ReadFrame %v", err, serr)
		}
		if err != nil {
			var fe *FrameError
			if !errors.As(err, &fe) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("unexpected error type %T: %v", err, err)
			}
			return
		}
		if n > len(b) || n < HeaderSize || n-HeaderSize > fuzzMaxBody {
			t.Fatalf("frame of %d bytes from %d", n, len(b))
		}
		if !proto.Equal(fr.Meta, sf.Meta) || !bytes.Equal(fr.Payload, sf.Payload) {
			t.Fatal("ParseFrame and ReadFrame disagree")
		}
		msg, att, ok := fr.Parts()
		if !ok {
			return
		}
		if len(msg)+len(att) != len(fr.Payload) {
			t.Fatal("parts do not cover the payload")
		}
		meta := proto.Clone(fr.Meta).(*metapb.RpcMeta)
		again, err := AppendFrame(nil, meta, msg, att)
		if err != nil {
			t.Fatal(err)
		}
		fr2, n2, err := ParseFrame(again, ^uint32(0))
		if err != nil || n2 != len(again) {
			t.Fatalf("re-encoded frame: %v (%d of %d)", err, n2, len(again))
		}
		msg2, att2, ok := fr2.Parts()
		if !ok || !bytes.Equal(msg, msg2) || !bytes.Equal(att, att2) {
			t.Fatal("re-encoded frame has other parts")
		}
		fr2.Meta.AttachmentSize = fr.Meta.AttachmentSize // AppendFrame owns this field
		if !proto.Equal(fr.Meta, fr2.Meta) {
			t.Fatalf("re-encoded meta differs:\n%v\n%v", fr.Meta, fr2.Meta)
		}
	})
}

// The RpcMeta decoder never panics and what it accepts survives a round
// trip.
func FuzzDecodeMeta(f *testing.F) {
	for _, b := range goldenSeeds(f) {
		if fr, _, err := ParseFrame(b, DefaultMaxBodySize); err == nil {
			m, _ := proto.Marshal(fr.Meta)
			f.Add(m)
		}
	}
	f.Add([]byte{0x0a, 0x02, 0x0a, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		var m metapb.RpcMeta
		if err := DecodeMeta(b, &m); err != nil {
			var fe *FrameError
			if !errors.As(err, &fe) {
				t.Fatalf("error of type %T", err)
			}
			return
		}
		enc, err := proto.MarshalOptions{Deterministic: true}.Marshal(&m)
		if err != nil {
			t.Fatalf("accepted meta does not encode: %v", err)
		}
		var m2 metapb.RpcMeta
		if err := DecodeMeta(enc, &m2); err != nil || !proto.Equal(&m, &m2) {
			t.Fatalf("round trip: %v", err)
		}
	})
}

// The decode's bound is never skipped for a message that decodes: every
// input proto.Unmarshal takes as a FileDescriptorProto (nested and
// repeated messages, strings, scalars, unknown fields) or a Struct (maps
// of recursive values), the walk reads too, and never charges less than
// the message's own wire size.
func FuzzDecodeCost(f *testing.F) {
	for _, s := range goldenSeeds(f) {
		if fr, _, err := ParseFrame(s, DefaultMaxBodySize); err == nil {
			f.Add(fr.Payload)
		}
	}
	rich, _ := proto.Marshal(&descriptorpb.FileDescriptorProto{Name: proto.String("a.proto"),
		MessageType: []*descriptorpb.DescriptorProto{{Name: proto.String("M"), Field: []*descriptorpb.FieldDescriptorProto{{Number: proto.Int32(1)}}}}})
	f.Add(rich)
	st, _ := structpb.NewStruct(map[string]any{"a": []any{1.0, "x", map[string]any{"b": nil}}})
	sb, _ := proto.Marshal(st)
	f.Add(sb)
	targets := []proto.Message{&descriptorpb.FileDescriptorProto{}, &structpb.Struct{}}
	costs := make([]*decodeCost, len(targets))
	for i, m := range targets {
		costs[i] = newDecodeCost(m.ProtoReflect().Descriptor())
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for i, m := range targets {
			m := m.ProtoReflect().New().Interface()
			if proto.Unmarshal(b, m) != nil {
				costs[i].of(b) // must not panic
				continue
			}
			n, ok := costs[i].root.cost(b, 0)
			if !ok {
				t.Fatalf("%T decodes %x but the walk cannot read it", m, b)
			}
			if n < int64(len(b)) {
				t.Fatalf("%T of %d bytes charged %d", m, len(b), n)
			}
		}
	})
}
