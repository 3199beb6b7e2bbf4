package baidustd

import (
	"testing"
)

// Decoding one recorded heartbeat frame: header, RpcMeta and the split of
// the payload.
func BenchmarkParseFrame(b *testing.B) {
	frame := readGolden(b, "brpc-1.12.1", "heartbeat.req.bin")
	b.ReportAllocs()
	for b.Loop() {
		f, _, err := ParseFrame(frame, DefaultMaxBodySize)
		if err != nil {
			b.Fatal(err)
		}
		if _, _, ok := f.Parts(); !ok {
			b.Fatal("parts")
		}
	}
}

// Encoding one heartbeat's response frame as the server writes it.
func BenchmarkAppendResponseFrame(b *testing.B) {
	buf := make([]byte, 0, 256)
	msg := []byte{0x08, 0x01}
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, err = AppendFrame(buf[:0], responseMeta(cidHB, 0, "", false), msg, nil); err != nil {
			b.Fatal(err)
		}
	}
}
