package baidustd

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/kvcar/kvcar/internal/baidustd/metapb"
	"github.com/kvcar/kvcar/internal/decodeheap"
	"github.com/kvcar/kvcar/internal/xllmpb/xservicepb"
)

// peerReadFrame reads one response frame from r.
func peerReadFrame(t *testing.T, r *bufio.Reader) Frame {
	t.Helper()
	f, err := ReadFrame(r, DefaultMaxBodySize)
	if err != nil {
		t.Fatalf("reading a response: %v", err)
	}
	return f
}

// peerHeap is the live heap after a collection.
func peerHeap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// peerUserFieldsMeta is a request meta for method whose user_fields
// (RpcMeta field 9, map<string,string>) hold n distinct 4-byte keys with
// no value: 8 wire bytes an entry.
func peerUserFieldsMeta(t *testing.T, method string, n int) []byte {
	t.Helper()
	mb, err := proto.Marshal(requestMeta(testSvc, method, 1, nil, false))
	if err != nil {
		t.Fatal(err)
	}
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	for i := range n {
		key := []byte{alphabet[i&63], alphabet[i>>6&63], alphabet[i>>12&63], alphabet[i>>18&63]}
		var entry []byte
		entry = protowire.AppendTag(entry, 1, protowire.BytesType)
		entry = protowire.AppendBytes(entry, key)
		mb = protowire.AppendTag(mb, 9, protowire.BytesType)
		mb = protowire.AppendBytes(mb, entry)
	}
	return mb
}

// peerPeakHeap runs fn and returns how far the heap rose above where it
// was before, sampled every millisecond while fn runs.
func peerPeakHeap(fn func()) int64 {
	base := peerHeap()
	stop := make(chan struct{})
	peak := make(chan int64)
	go func() {
		var m runtime.MemStats
		var top int64
		for {
			runtime.ReadMemStats(&m)
			top = max(top, int64(m.HeapAlloc))
			select {
			case <-stop:
				peak <- top
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	fn()
	close(stop)
	return <-peak - base
}

// TestRpcMetaDecodeIsCharged: what an RpcMeta decodes to is taken from
// the in-flight budget with its frame. Its user_fields (field 9,
// map<string,string>) decode to 7-11 times their wire bytes, so four
// frames of 2 MiB of them, each within an 8 MiB budget, once raised the
// heap to many times the budget; now a frame whose meta would decode past
// the budget closes its connection (a meta over 4 KiB is not decoded to
// answer it), and the heap stays within a few times the budget, as with
// the same bytes carried as the message.
func TestRpcMetaDecodeIsCharged(t *testing.T) {
	const limit = 8 << 20
	const conns = 4
	addr, srv := startServer(t, ServerOptions{Identity: "h:1", MaxBodySize: limit, MaxInflightBytes: limit}, map[string]Handler{
		"Hold": func(ctx context.Context, r *Request) (Response, error) { return Response{}, nil },
	})
	send := func(frame []byte, answered bool) {
		var wg sync.WaitGroup
		for range conns {
			wg.Go(func() {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Error(err)
					return
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(30 * time.Second))
				if _, err := c.Write(frame); err != nil {
					t.Error(err)
					return
				}
				f, err := ReadFrame(bufio.NewReader(c), DefaultMaxBodySize)
				switch {
				case answered && err != nil:
					t.Errorf("no answer: %v", err)
				case !answered && err == nil:
					t.Errorf("a meta decoding past the budget was answered: %v", f.Meta)
				}
			})
		}
		wg.Wait()
	}
	meta := peerUserFieldsMeta(t, "Hold", (limit/conns-256)/8)
	metaFrame := append(frameHeader(uint32(len(meta)), uint32(len(meta))), meta...)
	mb, _ := proto.Marshal(requestMeta(testSvc, "Hold", 1, nil, false))
	plainFrame := append(append(frameHeader(uint32(len(meta)), uint32(len(mb))), mb...), make([]byte, len(meta)-len(mb))...)

	plain := peerPeakHeap(func() { send(plainFrame, true) })
	start := time.Now()
	withMeta := peerPeakHeap(func() { send(metaFrame, false) })
	t.Logf("%d frames of %d bytes, budget %d: heap rose %d bytes with the bytes in the message, %d (%.1fx the budget) with them in user_fields (%v)",
		conns, len(metaFrame), srv.inflight.Max(), plain, withMeta, float64(withMeta)/float64(srv.inflight.Max()), time.Since(start))
	waitUsed(t, srv, 0)
	if withMeta > 3*srv.inflight.Max() {
		t.Errorf("frames within the in-flight budget of %d raised the heap by %d bytes: RpcMeta.user_fields is decoded outside the budget",
			srv.inflight.Max(), withMeta)
	}
}

// TestNegativeAttachmentSizeText: a negative attachment_size is answered
// EREQUEST with a text that says so, not that it "is larger than" the
// request.
func TestNegativeAttachmentSizeText(t *testing.T) {
	addr, _ := startServer(t, ServerOptions{Identity: "h:1"}, map[string]Handler{"Echo": echo})
	m := requestMeta(testSvc, "Echo", 9, nil, false)
	m.AttachmentSize = proto.Int32(-5)
	mb, _ := proto.Marshal(m)
	b := append(append(frameHeader(uint32(len(mb)+3), uint32(len(mb))), mb...), "abc"...)
	f, _, err := ParseFrame(exchange(t, addr, b, 1)[0], DefaultMaxBodySize)
	if err != nil {
		t.Fatal(err)
	}
	rm := f.Meta.GetResponse()
	t.Logf("code %d text %q", rm.GetErrorCode(), rm.GetErrorText())
	if rm.GetErrorCode() != int32(EREQUEST) {
		t.Fatalf("code %d, want EREQUEST", rm.GetErrorCode())
	}
	if strings.Contains(rm.GetErrorText(), "attachment_size=-5 is larger than") {
		t.Errorf("a negative attachment_size is reported as larger than the request: %q", rm.GetErrorText())
	}
}

// TestUnparsableGzipMessageNamesItsCompressType: a gzip request whose
// decompressed bytes are not the message is answered as brpc words it,
// naming the request's compress type and its payload's size as sent
// ("Fail to parse request message, CompressType=gzip, request_size=N").
func TestUnparsableGzipMessageNamesItsCompressType(t *testing.T) {
	addr, _ := startServer(t, ServerOptions{Identity: "h:1"}, map[string]Handler{
		"File": Unary(func(_ context.Context, f *descriptorpb.FileDescriptorProto) (*descriptorpb.FileDescriptorProto, error) {
			return f, nil
		}),
	})
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	w.Write([]byte{0x0a, 0x7f, 1}) // a truncated field
	w.Close()
	m := requestMeta(testSvc, "File", 1, nil, false)
	m.CompressType = proto.Int32(CompressGzip)
	resp, _ := rawCall(t, addr, m, gz.Bytes())
	rm := resp.GetResponse()
	t.Logf("code %d text %q (payload %d bytes)", rm.GetErrorCode(), rm.GetErrorText(), gz.Len())
	if rm.GetErrorCode() != int32(EREQUEST) {
		t.Fatalf("code %d, want EREQUEST", rm.GetErrorCode())
	}
	if !strings.Contains(rm.GetErrorText(), "CompressType=gzip") {
		t.Errorf("a gzip request that does not parse is reported as %q, want CompressType=gzip", rm.GetErrorText())
	}
}

// TestFramingEdgeCases: framing edge cases, each on its own connection, with another
// connection's calls served throughout and the budget given back.
func TestFramingEdgeCases(t *testing.T) {
	addr, srv := startServer(t, ServerOptions{Identity: "h:1", MaxBodySize: 1 << 20, FrameReadTimeout: 500 * time.Millisecond},
		map[string]Handler{"Echo": echo})
	good := newClient(t, addr, ClientOptions{})
	ctx := ctxT(t, 20*time.Second)
	okCall := func(what string) {
		t.Helper()
		if r, err := good.Call(ctx, testSvc, "Echo", []byte("ok"), nil); err != nil || string(r.Message) != "ok" {
			t.Fatalf("after %s: the other connection: %v", what, err)
		}
	}
	mb, _ := proto.Marshal(requestMeta(testSvc, "Echo", 3, nil, false))

	// closed: the server closes the connection without an answer.
	closed := func(name string, b []byte, chunk int) {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		for len(b) > 0 {
			n := min(chunk, len(b))
			if _, err := c.Write(b[:n]); err != nil {
				break
			}
			b = b[n:]
		}
		if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
			t.Errorf("%s: %d bytes answered, %v; want the connection closed", name, n, err)
		}
		okCall(name)
	}
	closed("body 0xffffffff", frameHeader(0xffffffff, 0), 1)
	closed("meta 0xffffffff", frameHeader(10, 0xffffffff), 1)
	closed("meta > body by one", append(frameHeader(uint32(len(mb)-1), uint32(len(mb))), mb...), 1)
	closed("truncated meta", append(frameHeader(uint32(len(mb)), uint32(len(mb))), mb[:len(mb)-1]...), 64)
	// Slow loris: announces 1 MiB, trickles; FrameReadTimeout closes it.
	start := time.Now()
	func() {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write(append(frameHeader(1<<20, uint32(len(mb))), mb...))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		done := make(chan struct{})
		go func() {
			defer close(done)
			for range 50 {
				if _, err := c.Write([]byte{0}); err != nil {
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
		if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
			t.Errorf("slow loris: %d bytes, %v", n, err)
		}
		<-done
	}()
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("slow loris held its connection %v with a 500ms frame timeout", el)
	}
	okCall("slow loris")

	// A header split across 12 one-byte writes, then meta == body (an
	// empty message), is served.
	func() {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		b := append(frameHeader(uint32(len(mb)), uint32(len(mb))), mb...)
		for i := range b {
			c.Write(b[i : i+1])
			time.Sleep(time.Millisecond)
		}
		f := peerReadFrame(t, bufio.NewReader(c))
		if f.Meta.GetResponse().GetErrorCode() != 0 || f.Meta.GetCorrelationId() != 3 {
			t.Errorf("one-byte writes: %v", f.Meta)
		}
	}()

	// Unknown compress type, request+response both set, unknown meta
	// fields, a negative correlation id: each answered on its call.
	for _, c := range []struct {
		name string
		edit func(m *metapb.RpcMeta) []byte
		code Errno
	}{
		{"compress 99", func(m *metapb.RpcMeta) []byte { m.CompressType = proto.Int32(99); b, _ := proto.Marshal(m); return b }, EREQUEST},
		{"compress -1", func(m *metapb.RpcMeta) []byte { m.CompressType = proto.Int32(-1); b, _ := proto.Marshal(m); return b }, EREQUEST},
		{"request and response", func(m *metapb.RpcMeta) []byte {
			m.Response = &metapb.RpcResponseMeta{ErrorCode: proto.Int32(5)}
			b, _ := proto.Marshal(m)
			return b
		}, 0},
		{"unknown fields", func(m *metapb.RpcMeta) []byte {
			b, _ := proto.Marshal(m)
			b = protowire.AppendTag(b, 77, protowire.BytesType)
			b = protowire.AppendBytes(b, []byte("xyz"))
			b = protowire.AppendTag(b, 78, protowire.StartGroupType)
			b = protowire.AppendTag(b, 78, protowire.EndGroupType)
			return b
		}, 0},
		{"negative cid", func(m *metapb.RpcMeta) []byte { m.CorrelationId = proto.Int64(-7); b, _ := proto.Marshal(m); return b }, 0},
		{"stream settings", func(m *metapb.RpcMeta) []byte {
			m.StreamSettings = &metapb.StreamSettings{StreamId: proto.Int64(1)}
			b, _ := proto.Marshal(m)
			return b
		}, 0},
	} {
		m := requestMeta(testSvc, "Echo", 11, nil, false)
		meta := c.edit(m)
		b := append(append(frameHeader(uint32(len(meta)+2), uint32(len(meta))), meta...), "hi"...)
		f, _, err := ParseFrame(exchange(t, addr, b, 1)[0], DefaultMaxBodySize)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		t.Logf("%s: code %d %q cid %d", c.name, f.Meta.GetResponse().GetErrorCode(), f.Meta.GetResponse().GetErrorText(), f.Meta.GetCorrelationId())
		if Errno(f.Meta.GetResponse().GetErrorCode()) != c.code || f.Meta.GetCorrelationId() != m.GetCorrelationId() {
			t.Errorf("%s: %v", c.name, f.Meta)
		}
	}
	// A body of 0 bytes (an empty RpcMeta, no request): answered on the
	// call with an error, the connection served on.
	f, _, err := ParseFrame(exchange(t, addr, frameHeader(0, 0), 1)[0], DefaultMaxBodySize)
	if err != nil || f.Meta.GetResponse().GetErrorCode() == 0 {
		t.Errorf("an empty frame: %v %v", err, f.Meta)
	}
	t.Logf("empty frame: %v", f.Meta)
	waitUsed(t, srv, 0)
}

// TestParkedCallsAreCharged: a call at work holds its goroutine, stack,
// timer and context besides its frame, some 6,000 bytes where a minimal
// frame is charged ~50; the budget charges each call callCost more, so
// that calls parked in handlers (4 connections of 1,024 pipelined calls
// here) hold at most a few times the budget: those past it are refused
// ELIMIT.
func TestParkedCallsAreCharged(t *testing.T) {
	const conns, perConn = 4, 1024
	const budgetBytes = 1 << 20
	release := make(chan struct{})
	var once sync.Once
	rel := func() { once.Do(func() { close(release) }) }
	defer rel()
	started := make(chan struct{}, conns*perConn)
	addr, srv := startServer(t, ServerOptions{MaxBodySize: 64 << 10, MaxInflightBytes: budgetBytes}, map[string]Handler{
		"Hold": func(ctx context.Context, r *Request) (Response, error) {
			started <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
			}
			return Response{}, nil
		},
	})
	var frames []byte
	for i := range perConn {
		f, _ := AppendFrame(nil, requestMeta(testSvc, "Hold", int64(i+1), nil, false), nil, nil)
		frames = append(frames, f...)
	}
	before := peerHeap()
	var beforeStack runtime.MemStats
	runtime.ReadMemStats(&beforeStack)
	var cs []net.Conn
	for range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write(frames); err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	peerWaitStable(srv)
	parked := len(started)
	if parked == 0 || parked == conns*perConn {
		t.Fatalf("%d of %d calls parked in handlers; want the budget to admit some, not all", parked, conns*perConn)
	}
	grew := peerHeap() - before
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	stack := int64(after.StackInuse) - int64(beforeStack.StackInuse)
	used := srv.inflight.Used()
	t.Logf("%d calls parked: budget charged %d bytes (%d a call), heap grew %d and stacks %d",
		parked, used, used/int64(parked), grew, stack)
	rel()
	for _, c := range cs {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		io.CopyN(io.Discard, c, 1)
	}
	if grew+stack > 4*budgetBytes {
		t.Errorf("%d calls parked hold %d bytes, past 4 times the budget of %d, which charged them %d",
			parked, grew+stack, budgetBytes, used)
	}
}

// peerWaitStable waits until the budget in use stops changing.
func peerWaitStable(srv *Server) int64 {
	last, same := int64(-1), 0
	for range 500 {
		time.Sleep(20 * time.Millisecond)
		u := srv.inflight.Used()
		if u == last {
			if same++; same == 10 {
				return u
			}
			continue
		}
		last, same = u, 0
	}
	return last
}

// TestDecodeCostChargesASmallMap: a map's own table is charged at its
// first entry: a HeartbeatRequest whose xtensor_info holds one map entry
// decoded to 512 bytes against a bound of 397 before it was.
func TestDecodeCostChargesASmallMap(t *testing.T) {
	var e, info, w []byte
	e = protowire.AppendTag(e, 1, protowire.BytesType)
	e = protowire.AppendBytes(e, []byte("k"))
	info = protowire.AppendTag(info, 3, protowire.BytesType)
	info = protowire.AppendBytes(info, e)
	w = protowire.AppendTag(w, 5, protowire.BytesType)
	w = protowire.AppendBytes(w, info)
	costs := newDecodeCost((&xservicepb.HeartbeatRequest{}).ProtoReflect().Descriptor())
	bound := costs.of(w)
	used, _, err := decodeheap.PerDecode(w, func() proto.Message { return &xservicepb.HeartbeatRequest{} })
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d wire bytes: %d decoded, bound %d", len(w), used, bound)
	if used > bound {
		t.Errorf("a HeartbeatRequest with one xtensor_info map entry decoded to %d bytes, over its bound %d", used, bound)
	}
}
