package baidustd

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kvcar/kvcar/internal/budget"
	"github.com/kvcar/kvcar/internal/testlog"
)

// A frame's buffer grows as its body arrives, to exactly the body, and
// reads what ParseFrame parses, at every size around the growth steps.
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
		if body := int64(len(frame) - HeaderSize); held != body || b.Used() != body {
			t.Fatalf("%d bytes: held %d, budget used %d, want the body's %d", size, held, b.Used(), body)
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
		h := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32([]byte(Magic), DefaultMaxBodySize), 16)
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
	big := make([]byte, 250<<10)
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
	if !strings.Contains(logs.String(), "requests in flight at the limit") {
		t.Errorf("no refusal logged:\n%s", logs.String())
	}

	release()
	held.Wait()
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
