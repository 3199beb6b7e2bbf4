package sockio

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

func pair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// bigVector returns 3,000 buffers of up to 4 KB, some 6 MB in all, and
// their bytes in order.
func bigVector() (bufs [][]byte, all []byte) {
	for i := range 3000 {
		b := bytes.Repeat([]byte{byte(i)}, 1+i*7%4093)
		bufs = append(bufs, b)
		all = append(all, b...)
	}
	return bufs, all
}

// expectRead reads len(want) bytes from r and fails unless they are want.
func expectRead(t *testing.T, r io.Reader, want string) {
	t.Helper()
	buf := make([]byte, len(want))
	if _, err := io.ReadFull(r, buf); err != nil || string(buf) != want {
		t.Fatalf("read %q, %v; want %q", buf, err, want)
	}
}

// TestWritevWholeThroughFullSocket: a vector far larger than the socket's
// buffers, written while the peer reads slowly, arrives whole and in
// order: the writes that would block wait in the poller and go on.
func TestWritevWholeThroughFullSocket(t *testing.T) {
	client, server := pair(t)
	if New(client).Raw() == nil {
		t.Fatal("a TCP connection has no raw access")
	}
	bufs, want := bigVector()
	got := make(chan []byte, 1)
	go func() {
		var all []byte
		buf := make([]byte, 1000)
		for {
			time.Sleep(time.Microsecond)
			n, err := server.Read(buf)
			all = append(all, buf[:n]...)
			if err != nil {
				got <- all
				return
			}
		}
	}()
	n, err := New(client).Writev(bufs)
	if err != nil || n != len(want) {
		t.Fatalf("Writev: %d of %d bytes, %v", n, len(want), err)
	}
	client.Close()
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("peer read %d bytes, want %d equal ones", len(b), len(want))
	}
}

// TestReadEOFAndDeadline: Read returns what the peer sent, io.EOF once it
// closed, and the deadline's error when one passes with nothing to read.
func TestReadEOFAndDeadline(t *testing.T) {
	client, server := pair(t)
	rs := New(server)
	_ = server.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	buf := make([]byte, 16)
	if _, err := rs.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v", err)
	}
	_ = server.SetReadDeadline(time.Time{})
	if _, err := New(client).Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	n, err := io.ReadFull(rs, buf[:5])
	if err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	client.Close()
	if n, err := rs.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("after the peer closed: %d, %v", n, err)
	}
	server.Close()
	if _, err := rs.Read(buf); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read of a closed connection: %v", err)
	}
}

// TestNotASocket: a connection that is not a socket is read and written
// through its own methods.
func TestNotASocket(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() { _, _ = New(a).Writev([][]byte{[]byte("ab"), []byte("cd")}) }()
	buf := make([]byte, 4)
	if _, err := io.ReadFull(New(b), buf); err != nil || string(buf) != "abcd" {
		t.Fatalf("%q %v", buf, err)
	}
}

// TestSendWaitsForTheAnswer: Send returns only once the peer has
// answered the request it wrote, and the answer is then read whole; the
// peer saw the request whole before answering.
func TestSendWaitsForTheAnswer(t *testing.T) {
	client, server := pair(t)
	const delay = 50 * time.Millisecond
	req := bytes.Repeat([]byte("request "), 1000)
	errc := make(chan error, 1)
	go func() {
		got := make([]byte, len(req))
		if _, err := io.ReadFull(server, got); err != nil || !bytes.Equal(got, req) {
			errc <- fmt.Errorf("peer read %d bytes, %v", len(got), err)
			return
		}
		time.Sleep(delay)
		_, err := server.Write([]byte("answer"))
		errc <- err
	}()
	cs := New(client)
	start := time.Now()
	n, err := cs.Send([][]byte{req[:100], nil, req[100:]})
	if took := time.Since(start); err != nil || n != len(req) || took < delay {
		t.Fatalf("Send: %d of %d bytes, %v, after %v (the answer came after %v)", n, len(req), err, took, delay)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	expectRead(t, cs, "answer")
}

// TestSendPastTheSocketsRoom: a request larger than the socket's
// buffers, read slowly, arrives whole and in order; Send then returns
// without waiting for an answer, which a read waits for as usual.
func TestSendPastTheSocketsRoom(t *testing.T) {
	client, server := pair(t)
	// Fixed buffers hold a small part of the request, whatever the
	// kernel's autotuning would allow.
	if err := client.(*net.TCPConn).SetWriteBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	if err := server.(*net.TCPConn).SetReadBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	bufs, want := bigVector()
	got := make(chan []byte, 1)
	go func() {
		// The socket fills before the peer starts reading.
		time.Sleep(100 * time.Millisecond)
		all := make([]byte, 0, len(want))
		buf := make([]byte, 64<<10)
		for len(all) < len(want) {
			n, err := server.Read(buf)
			all = append(all, buf[:n]...)
			if err != nil {
				break
			}
		}
		got <- all
	}()
	cs := New(client)
	n, err := cs.Send(bufs)
	if err != nil || n != len(want) {
		t.Fatalf("Send: %d of %d bytes, %v", n, len(want), err)
	}
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("peer read %d bytes, want %d equal ones", len(b), len(want))
	}
	if _, err := server.Write([]byte("ok")); err != nil {
		t.Fatal(err)
	}
	expectRead(t, cs, "ok")
}

// TestSendWaitEnds: a wait that no answer ends is ended by the read
// deadline or by the peer closing, each wrapped in ErrWaiting or seen by
// the read after; a write that fails is not.
func TestSendWaitEnds(t *testing.T) {
	client, server := pair(t)
	cs := New(client)
	_ = client.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := cs.Send([][]byte{[]byte("ping")}); !errors.Is(err, ErrWaiting) || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Send with no answer by the deadline: %v", err)
	}
	_ = client.SetReadDeadline(time.Time{})
	go func() {
		// Both pings, then the peer closes without an answer.
		buf := make([]byte, 8)
		_, _ = io.ReadFull(server, buf)
		server.Close()
	}()
	if _, err := cs.Send([][]byte{[]byte("ping")}); err != nil {
		t.Fatalf("Send to a peer that closes: %v", err)
	}
	buf := make([]byte, 4)
	if n, err := cs.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("after the peer closed: %d, %v", n, err)
	}
	client.Close()
	if _, err := cs.Send([][]byte{[]byte("ping")}); err == nil || errors.Is(err, ErrWaiting) {
		t.Fatalf("Send on a closed connection: %v", err)
	}
}

// TestReadTakenHoldsNoBufferWhileWaiting: ReadTaken's buffer is taken
// for a read attempt and given back before the wait, so a connection
// waiting for input holds none; the read that finds input returns the
// buffer with it, and one that finds the end of the stream or passes the
// deadline gives it back.
func TestReadTakenHoldsNoBufferWhileWaiting(t *testing.T) {
	client, server := pair(t)
	var out, takes atomic.Int32
	rs := New(server)
	rs.SetTake(func() []byte { out.Add(1); takes.Add(1); return make([]byte, 64) }, func() { out.Add(-1) })
	type result struct {
		buf []byte
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		buf, n, err := rs.ReadTaken()
		done <- result{buf, n, err}
	}()
	time.Sleep(50 * time.Millisecond)
	if out.Load() != 0 || takes.Load() == 0 {
		t.Fatalf("waiting for input: %d buffers held, %d taken", out.Load(), takes.Load())
	}
	if _, err := client.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || string(r.buf[:r.n]) != "hi" || out.Load() != 1 {
		t.Fatalf("ReadTaken: %q, %v, %d buffers held", r.buf[:r.n], r.err, out.Load())
	}
	out.Add(-1)
	_ = server.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if buf, _, err := rs.ReadTaken(); buf != nil || !errors.Is(err, os.ErrDeadlineExceeded) || out.Load() != 0 {
		t.Fatalf("past the deadline: %v, %v, %d buffers held", buf != nil, err, out.Load())
	}
	_ = server.SetReadDeadline(time.Time{})
	client.Close()
	if buf, _, err := rs.ReadTaken(); buf != nil || err != io.EOF || out.Load() != 0 {
		t.Fatalf("after the peer closed: %v, %v, %d buffers held", buf != nil, err, out.Load())
	}
}
