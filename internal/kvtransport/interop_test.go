package kvtransport

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// pyPublisher drives testdata/pypublisher.py: an XPUB and a ROUTER on
// real libzmq through Debian's python3-zmq, so these tests check the Go
// sockets against the library engines use, not against themselves.
type pyPublisher struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	xpub   string
	router string
}

const python = "/usr/bin/python3"

func requirePyZMQ(t *testing.T) {
	t.Helper()
	if err := exec.Command(python, "-c", "import zmq").Run(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("python3-zmq is required in CI (apt-get install python3-zmq): %v", err)
		}
		t.Skipf("skipping libzmq interop test: %s cannot import zmq (install Debian's python3-zmq): %v", python, err)
	}
}

func startPy(t *testing.T, xpubEP, routerEP string) *pyPublisher {
	t.Helper()
	cmd := exec.Command(python, "testdata/pypublisher.py", xpubEP, routerEP)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start publisher: %v", err)
	}
	p := &pyPublisher{t: t, cmd: cmd, stdin: stdin, lines: make(chan string, 64)}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	t.Cleanup(p.kill)
	ready := p.expect("ready ")
	var xport, rport string
	fmt.Sscanf(ready, "ready %s %s", &xport, &rport)
	p.xpub, p.router = "tcp://127.0.0.1:"+xport, "tcp://127.0.0.1:"+rport
	return p
}

func (p *pyPublisher) expect(prefix string) string {
	p.t.Helper()
	return p.expectPolling(prefix, nil)
}

// expectPolling waits for a line starting with prefix, polling s in the
// meantime: a subscriber's subscription goes out only once libzmq has
// attached the completed connection, which it does inside a call on the
// socket.
func (p *pyPublisher) expectPolling(prefix string, s *Subscriber) string {
	p.t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				p.t.Fatalf("publisher exited while waiting for %q", prefix)
			}
			if strings.HasPrefix(line, prefix) {
				return line
			}
		case <-deadline:
			p.t.Fatalf("timed out waiting for %q from publisher", prefix)
		case <-time.After(5 * time.Millisecond):
			if s != nil {
				if _, err := s.Wait(nil, 5*time.Millisecond); err != nil {
					p.t.Fatal(err)
				}
			}
		}
	}
}

func (p *pyPublisher) send(cmd string) {
	p.t.Helper()
	if _, err := io.WriteString(p.stdin, cmd+"\n"); err != nil {
		p.t.Fatalf("publisher command %q: %v", cmd, err)
	}
	p.expect("ok")
}

func (p *pyPublisher) kill() {
	if p.cmd.Process != nil && p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
}

func waitLink(t *testing.T, s *Subscriber, want LinkEvent, d time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < d {
		if _, err := s.Wait(nil, 50*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		for {
			ev, ok, err := s.RecvLink()
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			if ev == want {
				return time.Since(start)
			}
		}
	}
	t.Fatalf("no %v link event within %v", want, d)
	return 0
}

func waitLive(t *testing.T, s *Subscriber, d time.Duration) [][]byte {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if _, err := s.Wait(nil, 50*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		frames, err := s.RecvLive()
		if err != nil {
			t.Fatal(err)
		}
		if frames != nil {
			return frames
		}
		// Drain link events so the monitor queue does not fill.
		for {
			if _, ok, _ := s.RecvLink(); !ok {
				break
			}
		}
	}
	t.Fatalf("no live message within %v", d)
	return nil
}

func beSeq(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }

// TestInteropLiveAndRestart covers R-WIRE-1 and R-REC-1 against libzmq:
// a SUB started before the publisher joins it, receives the 3-frame
// envelope, sees the publisher's SIGKILL as a disconnect, and rejoins a
// publisher restarted on the same port without any action of ours.
func TestInteropLiveAndRestart(t *testing.T) {
	requirePyZMQ(t)
	first := startPy(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0")

	ctx, err := NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	sub, err := ctx.Subscribe(first.xpub, "xllm-kv", SubscriberOptions{MaxMessageBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	waitLink(t, sub, LinkConnected, 5*time.Second)
	first.expectPolling("subscribed "+hex.EncodeToString([]byte("xllm-kv")), sub)

	payload := []byte{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90, 0x00}
	first.send("pub " + hex.EncodeToString([]byte("xllm-kv")) + " 7 " + hex.EncodeToString(payload))
	frames := waitLive(t, sub, 5*time.Second)
	if len(frames) != 3 || string(frames[0]) != "xllm-kv" || !bytes.Equal(frames[1], beSeq(7)) || !bytes.Equal(frames[2], payload) {
		t.Fatalf("live frames = %q", frames)
	}

	// A topic that only shares a prefix is delivered by SUB filtering;
	// exact matching is the consumer's job (checked in kvdir).
	first.send("pub " + hex.EncodeToString([]byte("other")) + " 8 00")

	first.kill()
	waitLink(t, sub, LinkDisconnected, 5*time.Second)

	second := startPy(t, first.xpub, first.router)
	took := waitLink(t, sub, LinkConnected, 10*time.Second)
	second.expectPolling("subscribed ", sub)
	t.Logf("rejoined restarted publisher in %v", took)
	second.send("pub " + hex.EncodeToString([]byte("xllm-kv")) + " 0 " + hex.EncodeToString(payload))
	frames = waitLive(t, sub, 5*time.Second)
	if !bytes.Equal(frames[1], beSeq(0)) {
		t.Fatalf("after restart seq frame = %x, want 0", frames[1])
	}
}

// TestInteropReplay covers R-WIRE-3 against a libzmq ROUTER: the request
// reaches it as [identity, empty, seq8] and every reply batch and the end
// marker come back in order.
func TestInteropReplay(t *testing.T) {
	requirePyZMQ(t)
	py := startPy(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
	py.send("snapshot 41 c0 41 c1")

	ctx, err := NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	sub, err := ctx.Subscribe(py.xpub, "", SubscriberOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	rep, err := ctx.DialReplay(py.router, ReplayOptions{MaxMessageBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Close()
	// Nothing is queued for a connection that is not up yet.
	for sent := time.Now(); ; time.Sleep(time.Millisecond) {
		err := rep.Send([][]byte{{}, beSeq(0)})
		if err == nil {
			break
		}
		if !errors.Is(err, ErrNotConnected) || time.Since(sent) > 5*time.Second {
			t.Fatal(err)
		}
	}
	py.expect("replay 0")

	want := [][][]byte{
		{{}, beSeq(41), {0xc0}},
		{{}, beSeq(41), {0xc1}},
		{{}, beSeq(^uint64(0)), {}},
	}
	var got [][][]byte
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < len(want) && time.Now().Before(deadline) {
		rd, err := sub.Wait(rep, 50*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if !rd.Replay {
			continue
		}
		for {
			frames, err := rep.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if frames == nil {
				break
			}
			got = append(got, cloneFrames(frames))
		}
	}
	if len(got) != len(want) {
		t.Fatalf("got %d replies, want %d: %q", len(got), len(want), got)
	}
	for i := range want {
		if len(got[i]) != 3 || !bytes.Equal(got[i][1], want[i][1]) || !bytes.Equal(got[i][2], want[i][2]) || len(got[i][0]) != 0 {
			t.Fatalf("reply %d = %q, want %q", i, got[i], want[i])
		}
	}
}
