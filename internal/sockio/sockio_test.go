package sockio

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
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

// TestWritevWholeThroughFullSocket: a vector far larger than the socket's
// buffers, written while the peer reads slowly, arrives whole and in
// order: the writes that would block wait in the poller and go on.
func TestWritevWholeThroughFullSocket(t *testing.T) {
	client, server := pair(t)
	if New(client).Raw() == nil {
		t.Fatal("a TCP connection has no raw access")
	}
	var bufs [][]byte
	var want []byte
	for i := range 3000 {
		b := bytes.Repeat([]byte{byte(i)}, 1+i*7%4093)
		bufs = append(bufs, b)
		want = append(want, b...)
	}
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
