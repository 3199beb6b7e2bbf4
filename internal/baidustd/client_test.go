package baidustd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"
)

// Calls pipelined on the one connection are answered out of order (each
// handler sleeps a random time) and every caller still gets its own
// answer: responses are matched by correlation id.
func TestClientPipelinesOnOneConnection(t *testing.T) {
	var mu sync.Mutex
	remotes := map[string]bool{}
	addr, _ := startServer(t, ServerOptions{}, map[string]Handler{
		"Echo": func(ctx context.Context, r *Request) (Response, error) {
			mu.Lock()
			remotes[r.RemoteAddr.String()] = true
			mu.Unlock()
			time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
			return Response{Message: r.Message}, nil
		},
	})
	c := newClient(t, addr, ClientOptions{})
	ctx := ctxT(t, 10*time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 200 {
		wg.Go(func() {
			want := fmt.Sprint(i)
			r, err := c.Call(ctx, testSvc, "Echo", []byte(want), nil)
			if err == nil && string(r.Message) != want {
				err = fmt.Errorf("call %s got %q", want, r.Message)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if len(remotes) != 1 {
		t.Fatalf("calls came on %d connections, want 1", len(remotes))
	}
}

// A call's deadline comes from its context; the answer that arrives later
// is dropped and the connection goes on serving.
func TestClientCallTimeout(t *testing.T) {
	addr, _ := startServer(t, ServerOptions{}, map[string]Handler{
		"Slow": func(ctx context.Context, r *Request) (Response, error) {
			time.Sleep(200 * time.Millisecond)
			return Response{Message: []byte("late")}, nil
		},
		"Echo": echo,
	})
	c := newClient(t, addr, ClientOptions{})
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Call(short, testSvc, "Slow", nil, nil)
	wantError(t, err, ERPCTIMEDOUT, "")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("timeout does not wrap context.DeadlineExceeded: %v", err)
	}
	if el := time.Since(start); el > time.Second {
		t.Fatalf("timed out after %v", el)
	}
	// A cancelled call says so.
	cctx, ccancel := context.WithCancel(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); ccancel() }()
	if _, err := c.Call(cctx, testSvc, "Slow", nil, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v", err)
	}
	cc := c.cc
	time.Sleep(250 * time.Millisecond) // the late answers arrive
	r, err := c.Call(ctxT(t, 5*time.Second), testSvc, "Echo", []byte("next"), nil)
	if err != nil || string(r.Message) != "next" {
		t.Fatalf("after a timeout: %v %q", err, r.Message)
	}
	if c.cc != cc {
		t.Fatal("a timeout replaced the connection")
	}
	cc.mu.Lock()
	left := len(cc.pending)
	cc.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d calls left pending", left)
	}
}

// A server that goes away fails the calls in flight with EFAILEDSOCKET;
// once it is back the next call dials again and succeeds.
func TestClientReconnects(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	started := make(chan struct{}, 1)
	mk := func() *Server {
		s := NewServer(ServerOptions{})
		s.Register(testSvc, "Echo", echo)
		s.Register(testSvc, "Hang", func(ctx context.Context, r *Request) (Response, error) {
			started <- struct{}{}
			<-ctx.Done()
			return Response{}, ctx.Err()
		})
		return s
	}
	s1 := mk()
	go s1.Serve(ln)
	c := newClient(t, addr, ClientOptions{})
	ctx := ctxT(t, 10*time.Second)
	if _, err := c.Call(ctx, testSvc, "Echo", nil, nil); err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() {
		_, err := c.Call(ctx, testSvc, "Hang", nil, nil)
		res <- err
	}()
	<-started
	s1.Close()
	if err := <-res; CodeOf(err) != EFAILEDSOCKET {
		t.Fatalf("call on a closed server: %v", err)
	}
	// Down: the call fails fast.
	if _, err := c.Call(ctx, testSvc, "Echo", nil, nil); CodeOf(err) != EFAILEDSOCKET {
		t.Fatalf("call with the server down: %v", err)
	}
	ln2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("port %s not free again: %v", addr, err)
	}
	s2 := mk()
	go s2.Serve(ln2)
	defer s2.Close()
	if r, err := c.Call(ctx, testSvc, "Echo", []byte("back"), nil); err != nil || string(r.Message) != "back" {
		t.Fatalf("after the restart: %v %q", err, r.Message)
	}
}

func TestClientClose(t *testing.T) {
	addr, _ := startServer(t, ServerOptions{}, map[string]Handler{
		"Hang": func(ctx context.Context, r *Request) (Response, error) { <-ctx.Done(); return Response{}, nil },
	})
	c := NewClient(addr, ClientOptions{})
	res := make(chan error, 1)
	go func() {
		_, err := c.Call(ctxT(t, 5*time.Second), testSvc, "Hang", nil, nil)
		res <- err
	}()
	time.Sleep(50 * time.Millisecond)
	c.Close()
	if err := <-res; !errors.Is(err, ErrClientClosed) {
		t.Fatalf("call in flight at Close: %v", err)
	}
	if _, err := c.Call(ctxT(t, time.Second), testSvc, "Hang", nil, nil); !errors.Is(err, ErrClientClosed) {
		t.Fatalf("call after Close: %v", err)
	}
}

// A response frame too large for the client breaks the connection with
// a clear error instead of being read.
func TestClientMaxBodySize(t *testing.T) {
	addr, _ := startServer(t, ServerOptions{}, map[string]Handler{
		"Big": func(ctx context.Context, r *Request) (Response, error) {
			return Response{Message: make([]byte, 4096)}, nil
		},
	})
	c := newClient(t, addr, ClientOptions{MaxBodySize: 1024})
	_, err := c.Call(ctxT(t, 5*time.Second), testSvc, "Big", nil, nil)
	var fe *FrameError
	if CodeOf(err) != EFAILEDSOCKET || !errors.As(err, &fe) {
		t.Fatalf("got %v, want EFAILEDSOCKET from a bad frame", err)
	}
}

// Messages and attachments of every size around the one past which a
// call writes them after the header instead of copying them into its
// frame arrive whole, pipelined with small calls on the same connection.
func TestClientLargeMessages(t *testing.T) {
	addr, _ := startServer(t, ServerOptions{}, map[string]Handler{"Echo": echo})
	c := newClient(t, addr, ClientOptions{})
	ctx := ctxT(t, 20*time.Second)
	var wg sync.WaitGroup
	for _, n := range []int{0, 1, inlineFrameBytes - 1, inlineFrameBytes, inlineFrameBytes + 1, 1 << 20, 5 << 20} {
		for _, withAtt := range []bool{false, true} {
			wg.Go(func() {
				msg := make([]byte, n)
				for i := range msg {
					msg[i] = byte(i * 7)
				}
				var o *CallOptions
				if withAtt {
					o = &CallOptions{Attachment: []byte("attachment")}
				}
				r, err := c.Call(ctx, testSvc, "Echo", msg, o)
				if err != nil || !bytes.Equal(r.Message, msg) || withAtt != (string(r.Attachment) == "attachment") {
					t.Errorf("%d bytes, attachment %v: %v, got %d bytes back", n, withAtt, err, len(r.Message))
				}
			})
		}
	}
	wg.Wait()
}
