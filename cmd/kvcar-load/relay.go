package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/kvcar/kvcar/internal/devcluster"
	"github.com/kvcar/kvcar/internal/sockio"
)

// relayEnv, when set in kvcar-load's environment, makes it the relay
// bound instead of the driver: it lists the engines' addresses, comma
// separated, and the process prints its listening address on stdout.
const relayEnv = "KVCAR_LOAD_RELAY_ENGINES"

// The relay bound is the least a relay can cost on this machine: one
// goroutine per client connection that reads a request by its
// Content-Length, writes it unchanged to a kept connection to an engine
// (the engines in turn), reads the answer by its Content-Length and writes
// it back, each in one write, through the same raw socket I/O as kvcar
// (internal/sockio). No parsing beyond the framing, no routing, no
// limits: what kvcar adds over it is kvcar's own, what it adds over
// direct is the hop's.

// relayMaxHead bounds a head the relay reads; the driver's are small.
const relayMaxHead = 16 << 10

// runRelay serves the relay on a loopback port until stdin closes (the
// driver's end of the pipe), the signal's way of telling it to stop.
func runRelay(engines string) error {
	addrs := strings.Split(engines, ",")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	fmt.Println(ln.Addr().String())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		ln.Close()
	}()
	// The connections' goroutines end with the process, right after the
	// listener closes.
	for {
		c, err := ln.Accept()
		if err != nil {
			return nil
		}
		go func() {
			defer c.Close()
			relayConn(c, addrs)
		}()
	}
}

// relayEnd is one side of a relayed exchange: a connection, its reader,
// the message read last (head, then body) and the vector a request is
// sent from.
type relayEnd struct {
	conn net.Conn
	io   *sockio.Conn
	br   *bufio.Reader
	msg  []byte
	out  [1][]byte
}

func newRelayEnd(c net.Conn) *relayEnd {
	e := &relayEnd{conn: c, io: sockio.New(c)}
	e.br = bufio.NewReaderSize(e.io, 64<<10)
	return e
}

// readMessage reads one HTTP/1.1 message framed by Content-Length (none
// means no body) into e.msg.
func (e *relayEnd) readMessage() error {
	e.msg = e.msg[:0]
	length := 0
	for {
		line, err := e.br.ReadSlice('\n')
		if err != nil {
			return err
		}
		e.msg = append(e.msg, line...)
		if len(e.msg) > relayMaxHead {
			return errors.New("head too large")
		}
		if len(line) <= 2 {
			break
		}
		if k, v, ok := bytes.Cut(line, []byte(":")); ok && bytes.EqualFold(k, []byte("Content-Length")) {
			if length, err = strconv.Atoi(string(bytes.TrimSpace(v))); err != nil {
				return err
			}
		}
	}
	head := len(e.msg)
	e.msg = append(e.msg, make([]byte, length)...)
	_, err := io.ReadFull(e.br, e.msg[head:])
	return err
}

func relayConn(c net.Conn, addrs []string) {
	client := newRelayEnd(c)
	engines := make([]*relayEnd, len(addrs))
	defer func() {
		for _, e := range engines {
			if e != nil {
				e.conn.Close()
			}
		}
	}()
	for turn := 0; ; turn++ {
		if client.readMessage() != nil {
			return
		}
		i := turn % len(addrs)
		if engines[i] == nil {
			ec, err := net.Dial("tcp", addrs[i])
			if err != nil {
				return
			}
			engines[i] = newRelayEnd(ec)
		}
		e := engines[i]
		// As kvcar does: the wait for the answer starts with the write.
		e.out[0] = client.msg
		if _, err := e.io.Send(e.out[:]); err != nil && !errors.Is(err, sockio.ErrWaiting) {
			return
		}
		if e.readMessage() != nil {
			return
		}
		if _, err := client.io.Write(e.msg); err != nil {
			return
		}
	}
}

// relayProcess is a running relay bound: kvcar-load itself, run again.
type relayProcess struct {
	cmd   *exec.Cmd
	stdin io.Closer
	addr  string
}

// startRelay runs the relay bound in front of engines as its own process,
// so that it pays for its system calls and wake-ups as kvcar does, on
// kvcar's CPUs when they are set.
func startRelay(ctx context.Context, engines []string, cpus []int) (*relayProcess, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("relay bound: %w", err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), relayEnv+"="+strings.Join(engines, ","))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("relay bound: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("relay bound: %w", err)
	}
	if err := devcluster.StartOnCPUs(cmd, cpus); err != nil {
		return nil, fmt.Errorf("relay bound: %w", err)
	}
	rp := &relayProcess{cmd: cmd, stdin: stdin}
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		lines <- strings.TrimSpace(line)
	}()
	select {
	case rp.addr = <-lines:
	case <-time.After(10 * time.Second):
	case <-ctx.Done():
	}
	if rp.addr == "" {
		return nil, errors.Join(errors.New("relay bound: no listening address"), rp.stop())
	}
	return rp, nil
}

func (rp *relayProcess) pid() int { return rp.cmd.Process.Pid }

// stop closes the relay's stdin, which ends it, and waits for it; it is
// killed after 10 s.
func (rp *relayProcess) stop() error {
	rp.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- rp.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		_ = rp.cmd.Process.Kill()
		return errors.Join(errors.New("relay bound: killed after 10 s"), <-done)
	}
}
