package server

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/kvcar/kvcar/internal/baidustd"
	"github.com/kvcar/kvcar/internal/baidustd/metapb"
	"github.com/kvcar/kvcar/internal/instance"
	"github.com/kvcar/kvcar/internal/lb"
	"github.com/kvcar/kvcar/internal/xllmpb"
)

// policyRouter routes with a real policy over a registry snapshot, as
// the command wires it to the registry.
type policyRouter struct {
	policy lb.Policy
	snap   *instance.Snapshot
}

func (r policyRouter) Policy() string { return r.policy.Name() }

func (r policyRouter) Route(req lb.Request) (lb.Decision, error) {
	return r.policy.Route(req, r.snap)
}

// routerFor returns an RR router over a snapshot in which each of names
// is an active DEFAULT instance with a load report. The snapshot is
// fixed, so that no registry runs in the process: measurements of the
// request path then count its own allocations only.
func routerFor(tb testing.TB, names ...string) policyRouter {
	tb.Helper()
	ins := make([]instance.Instance, len(names))
	for i, name := range names {
		ins[i] = instance.Instance{Meta: instance.Meta{Name: name, IncarnationID: "inc", DPSize: 1},
			Type: instance.Default, Role: instance.Default, State: instance.Active,
			HasLoad: true, LoadValid: true}
	}
	slices.SortFunc(ins, func(a, b instance.Instance) int { return strings.Compare(a.Meta.Name, b.Meta.Name) })
	return policyRouter{policy: lb.NewRR(), snap: &instance.Snapshot{Instances: ins, Version: 1, Synced: true}}
}

// startEngine runs a real HTTP engine on loopback and returns its
// host:port, the name it is registered under.
func startEngine(tb testing.TB, h http.HandlerFunc) string {
	tb.Helper()
	e := httptest.NewServer(h)
	tb.Cleanup(e.Close)
	return e.Listener.Addr().String()
}

// serveTCP runs a TCP server on loopback until the test ends, handing
// each connection, with its number from 0, to serve on its own goroutine;
// it returns the server's host:port. The cleanup closes the listener and
// every connection and waits for serve to return.
func serveTCP(t *testing.T, serve func(conn net.Conn, n int)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for i := 0; ; i++ {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
			wg.Go(func() { serve(conn, i) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// idsCompletion is a /v1/completions body with n realistic prompt ids.
func idsCompletion(n int) []byte {
	b := []byte(`{"model":"m","max_tokens":16,"prompt":[`)
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(i*7919%151936), 10)
	}
	return append(b, `],"temperature":0}`...)
}

// answeringEngine is a real HTTP engine on loopback that reads the body
// and answers a short completion, about the least an engine can do.
func answeringEngine(tb testing.TB) string {
	return startEngine(tb, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c","object":"text_completion","choices":[{"text":"ok","index":0,"finish_reason":"length"}]}`)
	})
}

// completionLoop returns a func that serves one /v1/completions of body
// through h, reusing the request and the writer so that only the
// handler's own work is counted.
func completionLoop(tb testing.TB, h http.Handler, body []byte) func() {
	r := bytes.NewReader(body)
	w := &discardWriter{h: http.Header{}}
	req := httptest.NewRequest(http.MethodPost, CompletionsPath, io.NopCloser(r))
	req.Header.Set("Content-Type", "application/json")
	return func() {
		r.Reset(body)
		req.Body = io.NopCloser(r)
		req.ContentLength = int64(len(body))
		clear(w.h)
		w.code = 0
		h.ServeHTTP(w, req)
		if w.code != http.StatusOK {
			tb.Fatalf("status %d", w.code)
		}
	}
}

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
	var sends sync.WaitGroup
	defer sends.Wait()
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
		// The output goes back while the next call is read, as an engine
		// serves its requests at once.
		sid := string(id) // id lies in buf, which the next frame overwrites
		sends.Go(func() { sendOne(service, sid) })
	}
}

// sendOne sends a request's whole output, one token, as one Generation.
// A Generation that does not arrive fails the request at kvcar, which is
// where the test sees it.
func sendOne(service *baidustd.Client, id string) {
	gen := &xllmpb.DisaggStreamGeneration{ReqId: "cmpl-1", ServiceReqId: id, GenStatus: &xllmpb.GenerationStatus{},
		Outputs: []*xllmpb.SequenceOutput{{Text: "ok", FinishReason: "length"}}, Finished: true,
		Usage: &xllmpb.OutputUsage{NumPromptTokens: 1, NumGeneratedTokens: 1, NumTotalTokens: 2}}
	var st xllmpb.StatusSet
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = service.CallProto(ctx, xllmpb.RPCService, xllmpb.MethodGenerations,
		&xllmpb.DisaggStreamGenerations{Gens: []*xllmpb.DisaggStreamGeneration{gen}}, &st, nil)
}
