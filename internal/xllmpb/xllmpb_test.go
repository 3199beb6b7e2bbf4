package xllmpb_test

import (
	"bytes"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kvcar/kvcar/internal/xllmpb"
	"github.com/kvcar/kvcar/internal/xllmpb/xservicepb"
)

// Message bytes recorded between real brpc peers built from xLLM's own
// .proto files (../shared/golden/brpc/README.md).
const (
	heartbeatHex = "0a0f3132372e302e302e313a31383030301a070807150000803e22040878101e3205696e632d31"
	idleHex      = "0a0f3132372e302e302e313a31383030301a003205696e632d31"
	cacheHex     = "0a0f3132372e302e302e313a3138303030" +
		"12360a10000102030405060708090a0b0c0d0e0f0a10101112131415161718191a1b1c1d1e1f1210f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff" +
		"1a070807150000803e22040878101e3205696e632d31"
	completionHex = "0a0a66616b652d6d6f64656c120568656c6c6f2002ba01057376632d31c2010401020304" +
		"ca01110a0f3132372e302e302e313a3138303030b2020e3132372e302e302e313a38383839"
	completionGenHex = "0a3a0a0b636d706c2d66616b652d3112057376632d311a00" +
		"2218120a207431303020743130311a02646522066c656e677468" + "2a060804100218063001"
	generationsHex = "0a400a06636d706c2d3112057376632d311a00" +
		"2211120548656c6c6f1a02b24d220473746f70" + "22100801120248691a02a368220473746f70" +
		"2a060804100218063001"
	statusSetHex = "0a020801"
)

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// roundTrip checks that want encodes to the recorded bytes exactly, and
// that the recorded bytes decode to want.
func roundTrip(t *testing.T, name, recorded string, want proto.Message) {
	t.Helper()
	b, err := proto.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if hex.EncodeToString(b) != recorded {
		t.Errorf("%s encodes to\n %x\nrecorded\n %s", name, b, recorded)
	}
	got := want.ProtoReflect().New().Interface()
	if err := proto.Unmarshal(unhex(t, recorded), got); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if !proto.Equal(got, want) {
		t.Errorf("%s decodes to %v, want %v", name, got, want)
	}
}

func TestHeartbeatWire(t *testing.T) {
	roundTrip(t, "heartbeat", heartbeatHex, &xservicepb.HeartbeatRequest{
		Name:           "127.0.0.1:18000",
		LoadMetrics:    &xservicepb.LoadMetrics{WaitingRequestsNum: 7, GpuCacheUsagePerc: 0.25},
		LatencyMetrics: &xservicepb.LatencyMetrics{RecentMaxTtft: 120, RecentMaxTbt: 30},
		IncarnationId:  "inc-1",
	})
	// An idle engine sends load_metrics present and empty.
	roundTrip(t, "idle heartbeat", idleHex, &xservicepb.HeartbeatRequest{
		Name: "127.0.0.1:18000", LoadMetrics: &xservicepb.LoadMetrics{}, IncarnationId: "inc-1",
	})
	var ce xservicepb.KvCacheEvent
	for _, k := range [][2]byte{{0x00, 0x0f}, {0x10, 0x1f}} {
		var key []byte
		for b := int(k[0]); b <= int(k[1]); b++ {
			key = append(key, byte(b))
		}
		ce.StoredCache = append(ce.StoredCache, key)
	}
	var removed []byte
	for b := 0xf0; b <= 0xff; b++ {
		removed = append(removed, byte(b))
	}
	ce.RemovedCache = [][]byte{removed}
	roundTrip(t, "heartbeat with cache_event", cacheHex, &xservicepb.HeartbeatRequest{
		Name: "127.0.0.1:18000", CacheEvent: &ce,
		LoadMetrics:    &xservicepb.LoadMetrics{WaitingRequestsNum: 7, GpuCacheUsagePerc: 0.25},
		LatencyMetrics: &xservicepb.LatencyMetrics{RecentMaxTtft: 120, RecentMaxTbt: 30},
		IncarnationId:  "inc-1",
	})
	roundTrip(t, "Status{ok}", "0801", &xservicepb.Status{Ok: true})
}

func TestCompletionWire(t *testing.T) {
	roundTrip(t, "completion", completionHex, &xllmpb.CompletionRequest{
		Model:              "fake-model",
		Prompt:             "hello",
		MaxTokens:          proto.Uint32(2),
		ServiceRequestId:   proto.String("svc-1"),
		TokenIds:           []int32{1, 2, 3, 4},
		Routing:            &xllmpb.Routing{PrefillName: "127.0.0.1:18000"},
		SourceXserviceAddr: proto.String("127.0.0.1:8889"),
	})
	// An empty CompletionResponse is zero bytes, as the engine answers.
	if b, _ := proto.Marshal(&xllmpb.CompletionResponse{}); len(b) != 0 {
		t.Errorf("empty response encodes to %x", b)
	}
	// token_ids sent unpacked decode the same.
	var unpacked []byte
	for _, id := range []byte{1, 2, 3, 4} {
		unpacked = append(unpacked, 0xc0, 0x01, id) // field 24, varint
	}
	var req xllmpb.CompletionRequest
	if err := proto.Unmarshal(unpacked, &req); err != nil || len(req.TokenIds) != 4 || req.TokenIds[3] != 4 {
		t.Fatalf("unpacked token_ids: %v %v", err, req.TokenIds)
	}
}

func TestGenerationsWire(t *testing.T) {
	usage := &xllmpb.OutputUsage{NumPromptTokens: 4, NumGeneratedTokens: 2, NumTotalTokens: 6}
	roundTrip(t, "completion generations", completionGenHex, &xllmpb.DisaggStreamGenerations{Gens: []*xllmpb.DisaggStreamGeneration{{
		ReqId: "cmpl-fake-1", ServiceReqId: "svc-1", GenStatus: &xllmpb.GenerationStatus{},
		Outputs:  []*xllmpb.SequenceOutput{{Text: " t100 t101", TokenIds: []int32{100, 101}, FinishReason: "length"}},
		Usage:    usage,
		Finished: true,
	}}})
	roundTrip(t, "generations", generationsHex, &xllmpb.DisaggStreamGenerations{Gens: []*xllmpb.DisaggStreamGeneration{{
		ReqId: "cmpl-1", ServiceReqId: "svc-1", GenStatus: &xllmpb.GenerationStatus{},
		Outputs: []*xllmpb.SequenceOutput{
			{Text: "Hello", TokenIds: []int32{9906}, FinishReason: "stop"},
			{Index: 1, Text: "Hi", TokenIds: []int32{13347}, FinishReason: "stop"},
		},
		Usage:    usage,
		Finished: true,
	}}})
	roundTrip(t, "StatusSet", statusSetHex, &xllmpb.StatusSet{AllStatus: []*xllmpb.Status{{Ok: true}}})
}

// The engine's HeartbeatRequest may carry xtensor_info (5), which the
// service's copy lacks; it decodes here (the extract has it) and a decoder
// without it skips it.
func TestHeartbeatXTensorSkipped(t *testing.T) {
	hb := &xservicepb.HeartbeatRequest{Name: "a:1", XtensorInfo: &xservicepb.XTensorHeartbeatInfo{WorkerFreePhyPages: []uint64{5}},
		IncarnationId: "i"}
	b, err := proto.Marshal(hb)
	if err != nil {
		t.Fatal(err)
	}
	var onlyName xservicepb.InstanceID // field 1 only: everything else is unknown to it
	if err := proto.Unmarshal(b, &onlyName); err != nil || onlyName.Name != "a:1" {
		t.Fatalf("%v %q", err, onlyName.Name)
	}
}

// The .proto files are the golden extracts unchanged.
func TestProtoFilesAreTheExtracts(t *testing.T) {
	orig := filepath.Join("..", "..", "..", "shared", "golden", "brpc", "proto")
	if _, err := os.Stat(orig); err != nil {
		t.Skipf("extracts not present: %v", err)
	}
	files, _ := filepath.Glob(filepath.Join(orig, "*.proto"))
	if len(files) == 0 {
		t.Fatal("no extracts")
	}
	for _, f := range files {
		a, _ := os.ReadFile(f)
		b, err := os.ReadFile(filepath.Join("proto", filepath.Base(f)))
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("proto/%s differs from the extract (%v)", filepath.Base(f), err)
		}
	}
}
