package decodeheap

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// A message of known size: a ListValue of 10,000 empty Values holds at
// least their 10,000 pointers and structs, and far less than a megabyte
// more.
func TestPerDecodeMeasuresTheMessage(t *testing.T) {
	l := &structpb.ListValue{Values: make([]*structpb.Value, 10000)}
	for i := range l.Values {
		l.Values[i] = &structpb.Value{}
	}
	wire, err := proto.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	used, m, err := PerDecode(wire, func() proto.Message { return new(structpb.ListValue) })
	if err != nil || len(m.(*structpb.ListValue).Values) != 10000 {
		t.Fatalf("decode: %v", err)
	}
	if least := int64(10000 * (8 + 40)); used < least || used > 10*least {
		t.Fatalf("%d bytes a decode, want within [%d, %d]", used, least, 10*least)
	}
	if _, _, err := PerDecode([]byte{0x0a, 0x05}, func() proto.Message { return new(structpb.ListValue) }); err == nil {
		t.Fatal("a truncated message decoded")
	}
}
