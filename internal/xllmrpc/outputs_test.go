package xllmrpc

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kvcar/kvcar/internal/baidustd"
	"github.com/kvcar/kvcar/internal/decodeheap"
	"github.com/kvcar/kvcar/internal/xllmpb"
)

// What a queued generation is charged is never under what its decode
// holds on the heap, measured over a megabyte or more of decodes, and
// for real generations (the recorded call's, and one with log
// probabilities) within four times it. Its wire size is not a bound: the
// empty outputs hold over 60 times theirs.
func TestHeldBytesBoundsTheDecode(t *testing.T) {
	f, _, err := baidustd.ParseFrame(golden(t, "brpc-1.17.0", "generations.req.bin"), baidustd.DefaultMaxBodySize)
	if err != nil {
		t.Fatal(err)
	}
	msg, _, _ := f.Parts()
	var recorded xllmpb.DisaggStreamGenerations
	if err := proto.Unmarshal(msg, &recorded); err != nil || len(recorded.Gens) != 1 {
		t.Fatalf("the recorded call: %v, %d generations", err, len(recorded.GetGens()))
	}
	empties := &xllmpb.DisaggStreamGeneration{ServiceReqId: "svc-1", Outputs: make([]*xllmpb.SequenceOutput, 5000)}
	for i := range empties.Outputs {
		empties.Outputs[i] = &xllmpb.SequenceOutput{}
	}
	ids := &xllmpb.DisaggStreamGeneration{ServiceReqId: "svc-1", Outputs: []*xllmpb.SequenceOutput{{TokenIds: make([]int32, 20000)}}}
	logprobs := &xllmpb.DisaggStreamGeneration{ReqId: "cmpl-1", ServiceReqId: "svc-1", GenStatus: &xllmpb.GenerationStatus{},
		Usage: &xllmpb.OutputUsage{NumPromptTokens: 2048, NumGeneratedTokens: 1, NumTotalTokens: 2049}}
	for i := range 4 {
		out := &xllmpb.SequenceOutput{Index: int32(i), Text: " token", TokenIds: []int32{31337}}
		lp := &xllmpb.LogProb{LogProbData: &xllmpb.LogProbData{Token: " token", TokenId: 31337, Logprob: -0.25}}
		for j := range 20 {
			lp.TopLogprobs = append(lp.TopLogprobs, &xllmpb.LogProbData{Token: strings.Repeat("x", j%7+1), TokenId: int32(j), Logprob: -float32(j)})
		}
		out.Logprobs = []*xllmpb.LogProb{lp}
		logprobs.Outputs = append(logprobs.Outputs, out)
	}
	withUnknown, _ := proto.Marshal(recorded.Gens[0])
	withUnknown = protowire.AppendTag(withUnknown, 99, protowire.BytesType)
	withUnknown = protowire.AppendBytes(withUnknown, make([]byte, 3000))

	for _, c := range []struct {
		name      string
		gen       *xllmpb.DisaggStreamGeneration
		wire      []byte
		realistic bool
	}{
		{"the recorded generation", recorded.Gens[0], nil, true},
		{"log probabilities", logprobs, nil, true},
		{"empty outputs", empties, nil, false},
		{"one-byte token ids", ids, nil, false},
		{"an unknown field", nil, withUnknown, false},
	} {
		wire := c.wire
		if wire == nil {
			if wire, err = proto.Marshal(c.gen); err != nil {
				t.Fatal(err)
			}
		}
		used, m, err := decodeheap.PerDecode(wire, func() proto.Message { return new(xllmpb.DisaggStreamGeneration) })
		if err != nil {
			t.Fatal(err)
		}
		held := heldBytes(m.(*xllmpb.DisaggStreamGeneration))
		t.Logf("%s: %d wire bytes, %d decoded, charged %d", c.name, len(wire), used, held)
		if used > held {
			t.Errorf("%s: a decode took %d bytes, over the %d charged", c.name, used, held)
		}
		if c.realistic && held > 4*used {
			t.Errorf("%s: %d charged, over 4 times the %d a decode took", c.name, held, used)
		}
	}
}

// The queues together stay within their own bound: a generation that
// does not fit ends its request with an error saying so, and what the
// queues held comes back as their readers take it and as requests end.
func TestAllQueuesBounded(t *testing.T) {
	gen := func(id string) *xllmpb.DisaggStreamGeneration {
		return &xllmpb.DisaggStreamGeneration{ServiceReqId: id, Outputs: []*xllmpb.SequenceOutput{{Text: strings.Repeat("t", 300)}}}
	}
	one := heldBytes(gen("a"))
	o := NewOutputs(10*one, 3*one)
	qa, _ := o.open("a")
	qb, _ := o.open("b")
	if !o.Deliver(gen("a")) || !o.Deliver(gen("a")) || !o.Deliver(gen("b")) {
		t.Fatal("three generations within the bound refused")
	}
	if used := o.all.Used(); used != 3*one {
		t.Fatalf("the queues hold %d bytes, want %d", used, 3*one)
	}
	if o.Deliver(gen("b")) {
		t.Fatal("a fourth generation taken past the bound")
	}
	if _, err := qb.take(); !errors.Is(err, errAllQueues) || !strings.Contains(err.Error(), "--rpc_max_queued_output_bytes") {
		t.Fatalf("the refused request's reader got %v", err)
	}
	if used := o.all.Used(); used != 2*one {
		t.Fatalf("after b failed the queues hold %d bytes, want a's %d", used, 2*one)
	}
	if gens, err := qa.take(); err != nil || len(gens) != 2 {
		t.Fatalf("a's reader got %d generations, %v", len(gens), err)
	}
	if !o.Deliver(gen("a")) {
		t.Fatal("a generation refused after the reader took the others")
	}
	o.close("a", qa)
	o.close("b", qb)
	if used := o.all.Used(); used != 0 {
		t.Fatalf("with every request ended the queues hold %d bytes", used)
	}
}
