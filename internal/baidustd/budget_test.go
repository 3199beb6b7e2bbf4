package baidustd

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvcar/kvcar/internal/baidustd/metapb"

	"github.com/kvcar/kvcar/internal/budget"
	"github.com/kvcar/kvcar/internal/decodeheap"
	"github.com/kvcar/kvcar/internal/testlog"
)

// A frame's buffer grows as its body arrives, to exactly the body, and
// reads what ParseFrame parses, at every size around the growth steps;
// the budget holds the body and what its meta decodes to.
func TestReadFrameGrowsToTheBody(t *testing.T) {
	for _, size := range []int{0, 1, firstChunk - 40, firstChunk, firstChunk + 1, 2*firstChunk + 7, 5*firstChunk + 3, 1 << 20} {
		m := requestMeta(testSvc, "Echo", 7, nil, false)
		payload := bytes.Repeat([]byte{0xa5}, size)
		frame, err := AppendFrame(nil, m, payload, nil)
		if err != nil {
			t.Fatal(err)
		}
		want, _, err := ParseFrame(frame, DefaultMaxBodySize)
		if err != nil {
			t.Fatal(err)
		}
		b := budget.New(1 << 30)
		f, held, err := readFrame(bufio.NewReader(bytes.NewReader(frame)), DefaultMaxBodySize, b)
		if err != nil {
			t.Fatalf("%d bytes: %v", size, err)
		}
		if !proto.Equal(f.Meta, want.Meta) || !bytes.Equal(f.Payload, want.Payload) {
			t.Fatalf("%d bytes: readFrame and ParseFrame disagree", size)
		}
		metaBytes, _ := proto.Marshal(f.Meta)
		if body := int64(len(frame)-HeaderSize) + metaCost.of(metaBytes); held != body || b.Used() != body {
			t.Fatalf("%d bytes: held %d, budget used %d, want the body and its meta's cost, %d", size, held, b.Used(), body)
		}
	}
}

// A header announcing the largest body costs the server its first chunk,
// not the body: eight such connections hold 512 KiB, where allocating
// each body at once held 512 MiB. When they close, everything is given
// back.
func TestHeaderAloneHoldsOnlyAFirstChunk(t *testing.T) {
	addr, srv := startServer(t, ServerOptions{}, map[string]Handler{"Echo": echo})
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const conns = 8
	var cs []net.Conn
	for range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		h := frameHeader(DefaultMaxBodySize, 16)
		if _, err := c.Write(append(h, make([]byte, 100)...)); err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	waitUsed(t, srv, conns*firstChunk)
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 16<<20 {
		t.Fatalf("the heap grew %d bytes for %d headers", grew, conns)
	}
	for _, c := range cs {
		c.Close()
	}
	waitUsed(t, srv, 0)
}

// waitUsed waits until the server's calls hold want bytes.
func waitUsed(t *testing.T, srv *Server, want int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); srv.inflight.Used() != want; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the calls hold %d bytes, want %d", srv.inflight.Used(), want)
		}
	}
}

// holdServer serves "Hold", whose calls wait for release (called at the
// test's end too, so that a failed test's calls end), and "Echo", on a
// server whose calls may hold 256 KiB together.
func holdServer(t *testing.T, logs *testlog.Buffer) (addr string, srv *Server, started chan struct{}, release func()) {
	started, released := make(chan struct{}, 4), make(chan struct{})
	release = sync.OnceFunc(func() { close(released) })
	opts := ServerOptions{Identity: "h:1", MaxBodySize: 256 << 10, MaxInflightBytes: 256 << 10}
	if logs != nil {
		opts.Logger = slog.New(slog.NewTextHandler(logs, nil))
	}
	addr, srv = startServer(t, opts, map[string]Handler{
		"Echo": echo,
		"Hold": func(ctx context.Context, r *Request) (Response, error) {
			started <- struct{}{}
			<-released
			return Response{Message: r.Message[:1]}, nil
		},
	})
	t.Cleanup(release)
	return addr, srv, started, release
}

// A call whose frame does not fit in what the calls in flight leave is
// answered ELIMIT, whether the budget refuses it after its meta came or
// before; its connection serves the next calls, and once the holders end
// the same call is served and every byte is given back.
func TestInflightBudgetRefusesWithELIMIT(t *testing.T) {
	var logs testlog.Buffer
	addr, srv, started, release := holdServer(t, &logs)
	c := newClient(t, addr, ClientOptions{})
	ctx := ctxT(t, 20*time.Second)
	var held sync.WaitGroup
	hold := func() {
		held.Go(func() {
			if _, err := c.Call(ctx, testSvc, "Hold", make([]byte, 100<<10), nil); err != nil {
				t.Errorf("the holding call: %v", err)
			}
		})
		<-started
	}
	big := make([]byte, 240<<10)
	const refused = "Reached server's limit on request bytes in flight: a frame of"

	// 100 KiB held: the big call's first two chunks fit, its meta with
	// them, and its third does not.
	hold()
	_, err := c.Call(ctx, testSvc, "Echo", big, nil)
	wantELIMIT(t, err, refused, "does not fit in 262144; retry later")
	if r, err := c.Call(ctx, testSvc, "Echo", []byte("small"), nil); err != nil || string(r.Message) != "small" {
		t.Fatalf("a call after the refusal on the same connection: %q %v", r.Message, err)
	}

	// 200 KiB held: not even its first chunk fits; its meta is read
	// outside the budget to answer it.
	hold()
	_, err = c.Call(ctx, testSvc, "Echo", big, nil)
	wantELIMIT(t, err, refused, "")
	// Two refusals within the minute: the first one logged, with its
	// count, and no more.
	if got := logs.String(); strings.Count(got, "requests in flight at the limit") != 1 || !strings.Contains(got, "refused_total=1") {
		t.Errorf("refusals logged:\n%s", got)
	}

	release()
	held.Wait()
	// The holding calls gave their bytes back as their handlers
	// returned, before their answers went out: nothing is held.
	waitUsed(t, srv, 0)
	if r, err := c.Call(ctx, testSvc, "Echo", big, nil); err != nil || len(r.Message) != len(big) {
		t.Fatalf("the big call once nothing is held: %d bytes, %v", len(r.Message), err)
	}
	waitUsed(t, srv, 0)
}

func wantELIMIT(t *testing.T, err error, prefix, suffix string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || e.Code != ELIMIT {
		t.Fatalf("got %v, want ELIMIT", err)
	}
	if !strings.HasPrefix(e.Text, "[h:1][E2004]"+prefix) || !strings.HasSuffix(e.Text, suffix) {
		t.Fatalf("error text %q", e.Text)
	}
}

// A compressed message takes what it decompresses to from the budget: a
// small frame that would grow past what the calls in flight leave is
// answered ELIMIT, and served once they end.
func TestDecompressedBytesCountAgainstTheBudget(t *testing.T) {
	addr, srv, started, release := holdServer(t, nil)
	c := newClient(t, addr, ClientOptions{})
	ctx := ctxT(t, 20*time.Second)
	done := make(chan error, 1)
	go func() {
		_, err := c.Call(ctx, testSvc, "Hold", make([]byte, 200<<10), nil)
		done <- err
	}()
	<-started

	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	w.Write(make([]byte, 100<<10))
	w.Close()
	m := requestMeta(testSvc, "Echo", 1, nil, false)
	m.CompressType = proto.Int32(CompressGzip)
	resp, _ := rawCall(t, addr, m, gz.Bytes())
	if got := resp.GetResponse(); got.GetErrorCode() != int32(ELIMIT) ||
		!strings.Contains(got.GetErrorText(), "decompressed (CompressType=gzip) does not fit in 262144") {
		t.Fatalf("a gzip message over the budget: %v", resp)
	}

	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitUsed(t, srv, 0) // given back after the answer went out
	m = requestMeta(testSvc, "Echo", 2, nil, false)
	m.CompressType = proto.Int32(CompressGzip)
	resp, payload := rawCall(t, addr, m, gz.Bytes())
	if resp.GetResponse().GetErrorCode() != 0 || len(payload) != 100<<10 {
		t.Fatalf("the same message once nothing is held: %v, %d bytes", resp, len(payload))
	}
	waitUsed(t, srv, 0)
}

// A refused frame whose meta is too large to read outside the budget
// cannot be answered: its connection is closed with the reason logged.
func TestRefusedFrameWithAHugeMetaClosesItsConnection(t *testing.T) {
	var logs testlog.Buffer
	addr, _, started, _ := holdServer(t, &logs)
	c := newClient(t, addr, ClientOptions{})
	go c.Call(ctxT(t, 20*time.Second), testSvc, "Hold", make([]byte, 200<<10), nil)
	<-started

	m := requestMeta(testSvc, "Echo", 1, &CallOptions{RequestID: strings.Repeat("r", 2*maxLooseMeta)}, false)
	frame, err := AppendFrame(nil, m, make([]byte, 100<<10), nil)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write(frame); err != nil {
		t.Fatal(err)
	}
	if n, err := conn.Read(make([]byte, 1)); err == nil {
		t.Fatalf("read %d bytes, want the connection closed", n)
	}
	if !strings.Contains(logs.String(), "does not fit the in-flight budget") {
		t.Fatalf("no reason logged:\n%s", logs.String())
	}
}

// decodeCost bounds what decoding allocates: for messages of every shape
// (nested and repeated messages, strings, bytes, packed and unpacked
// scalars, maps, unknown fields, scalars sent where a message belongs,
// and the empty repeated elements that decode to a hundred times their
// wire bytes), the heap a decode grows
// by, measured over many copies, stays under the bound, and for real
// messages within a few times of it.
func TestDecodeCostBoundsTheDecode(t *testing.T) {
	empties := &descriptorpb.FileDescriptorProto{}
	for range 20000 {
		empties.MessageType = append(empties.MessageType, &descriptorpb.DescriptorProto{})
	}
	rich := &descriptorpb.FileDescriptorProto{Name: proto.String("kvcar/test.proto"), Package: proto.String("kvcar.test"),
		Dependency: []string{"a.proto", "b.proto"}, PublicDependency: []int32{0, 1}, WeakDependency: []int32{1}}
	for i := range 200 {
		m := &descriptorpb.DescriptorProto{Name: proto.String(fmt.Sprintf("Message%d", i))}
		for j := range 8 {
			m.Field = append(m.Field, &descriptorpb.FieldDescriptorProto{Name: proto.String(fmt.Sprintf("field_%d", j)),
				Number: proto.Int32(int32(j + 1)), Label: descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum(),
				Type: descriptorpb.FieldDescriptorProto_TYPE_INT64.Enum(), JsonName: proto.String(fmt.Sprintf("field%d", j))})
		}
		m.ReservedRange = []*descriptorpb.DescriptorProto_ReservedRange{{Start: proto.Int32(100), End: proto.Int32(200)}}
		rich.MessageType = append(rich.MessageType, m)
	}
	st, err := structpb.NewStruct(map[string]any{"ids": []any{1.0, 2.0, 3.0}, "name": "kvcar", "nested": map[string]any{"a": true, "b": nil}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 500 {
		st.Fields[fmt.Sprintf("k%d", i)] = structpb.NewStringValue(strings.Repeat("v", i%40))
	}
	meta := requestMeta(testSvc, "Echo", 42, &CallOptions{LogID: 7, RequestID: "req-1"}, true)
	meta.AuthenticationData = bytes.Repeat([]byte{1}, 300)
	withUnknown, _ := proto.Marshal(meta)
	withUnknown = protowire.AppendTag(withUnknown, 999, protowire.BytesType)
	withUnknown = protowire.AppendBytes(withUnknown, make([]byte, 1000))
	packed, _ := proto.Marshal(&descriptorpb.SourceCodeInfo{Location: []*descriptorpb.SourceCodeInfo_Location{
		{Path: make([]int32, 5000), Span: []int32{1, 2, 3}}}})
	// message_type (4, a message) sent as 10-byte varints: the decode
	// keeps each as unknown bytes.
	var mismatched []byte
	for range 2000 {
		mismatched = protowire.AppendTag(mismatched, 4, protowire.VarintType)
		mismatched = protowire.AppendVarint(mismatched, 1<<63)
	}

	for _, c := range []struct {
		name      string
		msg       proto.Message
		wire      []byte
		realistic bool
	}{
		{"empty repeated messages", empties, nil, false},
		{"a rich descriptor", rich, nil, true},
		{"a struct with maps", st, nil, true},
		{"an RpcMeta with an unknown field", &metapb.RpcMeta{}, withUnknown, true},
		{"packed scalars", &descriptorpb.SourceCodeInfo{}, packed, false},
		{"scalars where a message belongs", &descriptorpb.FileDescriptorProto{}, mismatched, false},
	} {
		wire := c.wire
		if wire == nil {
			if wire, err = proto.Marshal(c.msg); err != nil {
				t.Fatal(err)
			}
		}
		costs := newDecodeCost(c.msg.ProtoReflect().Descriptor())
		bound := costs.of(wire)
		if walked, ok := costs.root.cost(wire, 0); !ok || walked != bound {
			t.Fatalf("%s: the walk gave %d, %v", c.name, walked, ok)
		}
		used, _, err := decodeheap.PerDecode(wire, func() proto.Message { return c.msg.ProtoReflect().New().Interface() })
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d wire bytes, %d decoded, bound %d", c.name, len(wire), used, bound)
		if used > bound {
			t.Errorf("%s: a decode took %d bytes, over the bound %d", c.name, used, bound)
		}
		if c.realistic && bound > 4*used {
			t.Errorf("%s: the bound %d is over 4 times the %d a decode took", c.name, bound, used)
		}
	}
	// Bytes the walk cannot read are charged the most any bytes can
	// cost: for FileDescriptorProto, an empty DescriptorProto's struct
	// for every 2 bytes.
	costs := newDecodeCost(empties.ProtoReflect().Descriptor())
	truncated := []byte{0x0a, 0x05, 1}
	if _, ok := costs.root.cost(truncated, 0); ok {
		t.Error("a truncated message parsed")
	}
	element := int64(reflect.TypeFor[descriptorpb.DescriptorProto]().Size()) + slotCost
	if got, least := costs.of(truncated), costs.root.size+int64(len(truncated))*element/2; got < least {
		t.Errorf("a truncated message charged %d, want at least %d", got, least)
	}
}

// A message that would decode past the budget is answered ELIMIT
// undecoded, though its frame fits; the same call with a message of
// ordinary shape and size is served.
func TestUnaryRefusesADecodePastTheBudget(t *testing.T) {
	var decoded atomic.Int32
	addr, srv := startServer(t, ServerOptions{Identity: "h:1", MaxBodySize: 1 << 20, MaxInflightBytes: 16 << 20}, map[string]Handler{
		"File": Unary(func(_ context.Context, f *descriptorpb.FileDescriptorProto) (*descriptorpb.FileDescriptorProto, error) {
			decoded.Add(1)
			return &descriptorpb.FileDescriptorProto{Name: proto.String(fmt.Sprint(len(f.MessageType)))}, nil
		}),
	})
	c := newClient(t, addr, ClientOptions{})
	ctx := ctxT(t, 10*time.Second)
	bomb := &descriptorpb.FileDescriptorProto{}
	for range 400 << 10 / 2 { // 400 KiB of empty elements: tens of MiB decoded
		bomb.MessageType = append(bomb.MessageType, &descriptorpb.DescriptorProto{})
	}
	var resp descriptorpb.FileDescriptorProto
	err := c.CallProto(ctx, testSvc, "File", bomb, &resp, nil)
	wantELIMIT(t, err, "Reached server's limit on request bytes in flight: request_size=409600 may decode to ", "which do not fit; retry later")
	if decoded.Load() != 0 {
		t.Fatal("the refused message was decoded")
	}
	bomb.MessageType = bomb.MessageType[:1000]
	if err := c.CallProto(ctx, testSvc, "File", bomb, &resp, nil); err != nil || resp.GetName() != "1000" {
		t.Fatalf("an ordinary message: %v %v", resp.GetName(), err)
	}
	waitUsed(t, srv, 0)
}
