package baidustd

import (
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// One port serves baidu_std and HTTP, told apart by the "PRPC" magic as
// brpc tells them apart.
func TestMuxSharesAPortWithHTTP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rpc := NewServer(ServerOptions{})
	rpc.Register(testSvc, "Echo", echo)
	mux := NewMux(ln, rpc, 200*time.Millisecond)
	served := make(chan error, 1)
	go func() { served <- mux.Serve() }()
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "http ok") })}
	go hs.Serve(mux.Listener())

	addr := ln.Addr().String()
	c := newClient(t, addr, ClientOptions{})
	ctx := ctxT(t, 5*time.Second)
	for range 3 {
		resp, err := http.Get("http://" + addr + "/")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "http ok" {
			t.Fatalf("HTTP got %q", body)
		}
		if r, err := c.Call(ctx, testSvc, "Echo", []byte("rpc ok"), nil); err != nil || string(r.Message) != "rpc ok" {
			t.Fatalf("baidu_std: %v %q", err, r.Message)
		}
	}
	// A connection that says nothing goes to HTTP after the sniff
	// timeout, whose server then deals with it; it does not hold up
	// anything else.
	silent, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	if r, err := c.Call(ctx, testSvc, "Echo", []byte("still"), nil); err != nil || string(r.Message) != "still" {
		t.Fatalf("with a silent connection open: %v %q", err, r.Message)
	}

	hs.Close()
	rpc.Close()
	mux.Close()
	if err := <-served; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Serve after Close: %v", err)
	}
}
