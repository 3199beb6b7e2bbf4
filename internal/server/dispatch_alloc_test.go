//go:build !race

package server

import (
	"bufio"
	"context"
	"io"
	"net"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/kvcar/kvcar/internal/baidustd"
	"github.com/kvcar/kvcar/internal/baidustd/metapb"
	"github.com/kvcar/kvcar/internal/xllmpb"
)

// completionServiceIDField is CompletionRequest.service_request_id.
const completionServiceIDField = 23

// frugalXLLMEngine is an xLLM engine on loopback that costs the same per
// request whatever the prompt's length, so that a measurement of the
// whole process counts kvcar's allocations: it reads each Completions
// frame into one reused buffer, finds service_request_id in the message
// without decoding the rest, answers the call and sends one finished
// Generation back.
func frugalXLLMEngine(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tb.Cleanup(func() { c.Close() })
			go serveFrugal(tb, c)
		}
	}()
	return ln.Addr().String()
}

func serveFrugal(tb testing.TB, c net.Conn) {
	r := bufio.NewReaderSize(c, 64<<10)
	var head [baidustd.HeaderSize]byte
	var buf, out []byte
	var service *baidustd.Client
	defer func() {
		if service != nil {
			service.Close()
		}
	}()
	gen := &xllmpb.DisaggStreamGeneration{ReqId: "cmpl-1", GenStatus: &xllmpb.GenerationStatus{},
		Outputs: []*xllmpb.SequenceOutput{{Text: "ok", FinishReason: "length"}}, Finished: true,
		Usage: &xllmpb.OutputUsage{NumPromptTokens: 1, NumGeneratedTokens: 1, NumTotalTokens: 2}}
	gens := &xllmpb.DisaggStreamGenerations{Gens: []*xllmpb.DisaggStreamGeneration{gen}}
	var st xllmpb.StatusSet
	for {
		if _, err := io.ReadFull(r, head[:]); err != nil {
			return
		}
		body, metaSize, err := baidustd.ParseHeader(head[:], baidustd.DefaultMaxBodySize)
		if err != nil {
			tb.Error(err)
			return
		}
		if cap(buf) < int(body) {
			buf = make([]byte, body)
		}
		buf = buf[:body]
		if _, err := io.ReadFull(r, buf); err != nil {
			return
		}
		var meta metapb.RpcMeta
		if err := baidustd.DecodeMeta(buf[:metaSize], &meta); err != nil {
			tb.Error(err)
			return
		}
		var id, source []byte
		for msg := buf[metaSize:]; len(msg) > 0; {
			num, typ, n := protowire.ConsumeTag(msg)
			m := protowire.ConsumeFieldValue(num, typ, msg[n:])
			if n < 0 || m < 0 {
				tb.Error("bad message")
				return
			}
			switch num {
			case completionServiceIDField:
				id, _ = protowire.ConsumeBytes(msg[n:])
			case 38: // source_xservice_addr
				source, _ = protowire.ConsumeBytes(msg[n:])
			}
			msg = msg[n+m:]
		}
		out, _ = baidustd.AppendFrame(out[:0], &metapb.RpcMeta{Response: &metapb.RpcResponseMeta{ErrorCode: new(int32)},
			CompressType: new(int32), CorrelationId: meta.CorrelationId}, nil, nil)
		if _, err := c.Write(out); err != nil {
			return
		}
		if service == nil {
			service = baidustd.NewClient(string(source), baidustd.ClientOptions{})
		}
		gen.ServiceReqId = string(id)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = service.CallProto(ctx, xllmpb.RPCService, xllmpb.MethodGenerations, gens, &st, nil)
		cancel()
		if err != nil {
			tb.Error(err)
			return
		}
	}
}

// TestDispatchAllocationsDoNotGrowWithPrompt: once the pools are warm, a
// completion dispatched to an xLLM engine over baidu_std allocates the
// same per request whatever its prompt's length, through the whole
// handler (parse, decision, the encoded message written from reused
// buffers, the Generation back): the prompt is copied once, from the
// body's storage into the message's, both reused. A prompt 32 times
// longer may cost at most 1 KiB and one allocation more, which is noise
// from the process's other goroutines.
func TestDispatchAllocationsDoNotGrowWithPrompt(t *testing.T) {
	engine := frugalXLLMEngine(t)
	router, reg := backendRouter(t, map[string]string{engine: ""})
	x := startXLLMSide(t, reg)
	s := New(Options{Router: router, Dispatcher: x.disp})
	s.SetReady(true)
	h := s.Handler()
	measure := func(ids int) (bytesPerOp, allocsPerOp float64) {
		const runs = 200
		serve := completionLoop(t, h, idsCompletion(ids))
		for range 20 {
			serve()
		}
		runtime.GC()
		defer debug.SetGCPercent(debug.SetGCPercent(-1))
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range runs {
			serve()
		}
		runtime.ReadMemStats(&after)
		return float64(after.TotalAlloc-before.TotalAlloc) / runs, float64(after.Mallocs-before.Mallocs) / runs
	}
	smallB, smallN := measure(2048)
	largeB, largeN := measure(65536)
	t.Logf("per request: 2048 ids %.0f B in %.1f allocations, 65536 ids %.0f B in %.1f allocations", smallB, smallN, largeB, largeN)
	if largeB-smallB > 1024 || largeN-smallN > 1 {
		t.Errorf("a prompt of 65536 ids allocates %.0f B per request in %.1f allocations, %.0f B more than one of 2048",
			largeB, largeN, largeB-smallB)
	}
}
