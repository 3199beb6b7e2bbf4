package kvtransport

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"
	"unsafe"

	zmq "github.com/pebbe/zmq4"
)

// cloneFrames copies a received message, whose frames the next receive
// overwrites.
func cloneFrames(frames [][]byte) [][]byte {
	out := make([][]byte, len(frames))
	for i, f := range frames {
		out[i] = bytes.Clone(f)
	}
	return out
}

// framePair connects a PUSH to a PULL over loopback TCP on c and returns
// the PUSH and the PULL as the package's receivers see it.
func framePair(t *testing.T, c *Context) (*zmq.Socket, *watched) {
	t.Helper()
	pull, err := c.newSocket(zmq.PULL)
	if err != nil {
		t.Fatal(err)
	}
	in := c.watch(pull, true)
	t.Cleanup(func() { in.Close() })
	if err := pull.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	ep, err := pull.GetLastEndpoint()
	if err != nil {
		t.Fatal(err)
	}
	push := pubTestPeer(t, c, zmq.PUSH, ep)
	t.Cleanup(func() { push.Close() })
	return push, in
}

// recvFrames waits up to 5 s for the next message on in.
func recvFrames(t *testing.T, in *watched) [][]byte {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		m, err := in.recv()
		if err != nil && !isAgain(err) {
			t.Fatal(err)
		}
		if m != nil {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatal("no message within 5s")
		}
		if _, err := pollOne(in.Socket, 50*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
}

func sendFrames(t *testing.T, s *zmq.Socket, frames [][]byte) {
	t.Helper()
	parts := make([]any, len(frames))
	for i, f := range frames {
		parts[i] = f
	}
	if _, err := s.SendMessage(parts...); err != nil {
		t.Fatal(err)
	}
}

// TestReceiveUsesLibzmqHandle: with the pinned pebbe/zmq4 the receives
// take libzmq's socket handle, not pebbe/zmq4's copying receive.
func TestReceiveUsesLibzmqHandle(t *testing.T) {
	if !handleOK {
		t.Fatal("pebbe/zmq4's Socket has no unsafe.Pointer field soc; receives fall back to RecvMessageBytes")
	}
}

// TestReceiveMatchesSentMessages sends messages of 1–16 frames whose
// sizes straddle libzmq's inline limit (33 bytes) and grow past the
// retained buffer, and checks each arrives whole, in order, with the
// buffer reused between messages: the frames of R-WIRE-1 and R-WIRE-3 arrive
// as sent.
func TestReceiveMatchesSentMessages(t *testing.T) {
	c := pubTestContext(t)
	push, in := framePair(t, c)
	rng := rand.New(rand.NewPCG(1, 2))
	sizes := []int{0, 1, 32, 33, 34, 200, 4096, 70_000}
	for i := range 600 {
		frames := make([][]byte, 1+rng.IntN(maxFrames))
		for j := range frames {
			n := sizes[rng.IntN(len(sizes))]
			if i%100 == 99 && j == 0 {
				n = frameRetainBytes + 12345 // past what the reader keeps
			}
			frames[j] = make([]byte, n)
			for k := range frames[j] {
				frames[j][k] = byte(rng.Uint32())
			}
		}
		sendFrames(t, push, frames)
		got := recvFrames(t, in)
		if len(got) != len(frames) {
			t.Fatalf("message %d: %d frames, want %d", i, len(got), len(frames))
		}
		for j := range frames {
			if !bytes.Equal(got[j], frames[j]) {
				t.Fatalf("message %d frame %d: %d bytes differ from the %d sent", i, j, len(got[j]), len(frames[j]))
			}
			if cap(got[j]) != len(got[j]) {
				t.Fatalf("message %d frame %d: capacity %d past its length %d lets an append overwrite the next frame", i, j, cap(got[j]), len(got[j]))
			}
		}
		if cap(in.fr.buf) > frameRetainBytes && i%100 != 99 {
			t.Fatalf("message %d: the reader keeps %d bytes, past its %d", i, cap(in.fr.buf), frameRetainBytes)
		}
	}
}

// TestReceiveDropsMessageOfTooManyFrames: a message of 17 frames is
// dropped whole with ErrTooManyFrames, and the next one arrives intact.
func TestReceiveDropsMessageOfTooManyFrames(t *testing.T) {
	c := pubTestContext(t)
	push, in := framePair(t, c)
	long := make([][]byte, maxFrames+1)
	for i := range long {
		long[i] = []byte(fmt.Sprintf("part %d", i))
	}
	sendFrames(t, push, long)
	next := [][]byte{[]byte("topic"), []byte("after")}
	sendFrames(t, push, next)
	deadline := time.Now().Add(5 * time.Second)
	for {
		m, err := in.recv()
		if errors.Is(err, ErrTooManyFrames) {
			break
		}
		if err != nil && !isAgain(err) || m != nil {
			t.Fatalf("got %q, %v; want ErrTooManyFrames", m, err)
		}
		if time.Now().After(deadline) {
			t.Fatal("nothing received within 5s")
		}
		if _, err := pollOne(in.Socket, 50*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	if got := recvFrames(t, in); len(got) != 2 || !bytes.Equal(got[0], next[0]) || !bytes.Equal(got[1], next[1]) {
		t.Fatalf("next message = %q, want %q", got, next)
	}
}

// TestReceiveDoesNotAllocate: a live message of three frames costs no
// allocation once the buffer has grown to it.
func TestReceiveDoesNotAllocate(t *testing.T) {
	c := pubTestContext(t)
	push, in := framePair(t, c)
	msg := [][]byte{[]byte("kv-events"), make([]byte, 8), bytes.Repeat([]byte{0xcd}, 3000)}
	const runs = 200
	for range runs + 2 {
		sendFrames(t, push, msg)
	}
	// The first message grows the buffer; the rest are queued meanwhile,
	// so that no receive below waits.
	recvFrames(t, in)
	time.Sleep(200 * time.Millisecond)
	allocs := testing.AllocsPerRun(runs, func() {
		if m := recvFrames(t, in); len(m) != 3 || len(m[2]) != 3000 {
			t.Fatalf("received %d frames", len(m))
		}
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations a message, want 0", allocs)
	}
}

// TestReceiveRetriesInterruptedCalls: a signal that interrupts libzmq
// inside a receive (the Go runtime sends its threads SIGURG to preempt
// goroutines) is no receive error.
func TestReceiveRetriesInterruptedCalls(t *testing.T) {
	c := pubTestContext(t)
	push, in := framePair(t, c)
	// The signals go to this goroutine's thread, which is the one in
	// libzmq's calls.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	pid, tid := os.Getpid(), syscall.Gettid()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = syscall.Tgkill(pid, tid, syscall.SIGURG)
			time.Sleep(5 * time.Microsecond)
		}
	}()
	defer func() { close(stop); <-done }()
	msg := [][]byte{[]byte("kv-events"), make([]byte, 8), make([]byte, 600)}
	for range 160 {
		for range 500 {
			sendFrames(t, push, msg)
		}
		for range 500 {
			if m := recvFrames(t, in); len(m) != 3 {
				t.Fatalf("received %d frames", len(m))
			}
		}
	}
}

// TestReceiveDropsMessageOverItsLimit: libzmq bounds each frame but not
// how many a message has, so a message whose frames add up to more than
// max message bytes and FrameSlack is dropped whole with
// ErrMessageTooLarge (R-CFG-2: what a publisher can make kvcar hold is
// bounded), and the next one arrives intact.
func TestReceiveDropsMessageOverItsLimit(t *testing.T) {
	c := pubTestContext(t)
	push, in := framePair(t, c)
	const maxMsg = 8 << 10
	if err := in.setMaxMessage(maxMsg); err != nil {
		t.Fatal(err)
	}
	// Every frame is within max message bytes; together they are not.
	big := make([][]byte, maxFrames)
	for i := range big {
		big[i] = make([]byte, maxMsg)
	}
	sendFrames(t, push, big)
	// A smaller message first, so that the buffer grows twice.
	medium := [][]byte{make([]byte, 40<<10)}
	sendFrames(t, push, medium)
	// Exactly as much as a message may have.
	within := [][]byte{make([]byte, FrameSlack-3), []byte("seq"), make([]byte, maxMsg)}
	sendFrames(t, push, within)
	deadline := time.Now().Add(5 * time.Second)
	for {
		m, err := in.recv()
		if errors.Is(err, ErrMessageTooLarge) {
			t.Log(err)
			break
		}
		if err != nil && !isAgain(err) || m != nil {
			t.Fatalf("got %d frames, %v; want ErrMessageTooLarge", len(m), err)
		}
		if time.Now().After(deadline) {
			t.Fatal("nothing received within 5s")
		}
		if _, err := pollOne(in.Socket, 50*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	if got := recvFrames(t, in); len(got) != 1 || len(got[0]) != len(medium[0]) {
		t.Fatalf("next message: %d frames", len(got))
	}
	if got := recvFrames(t, in); len(got) != 3 || len(got[0]) != FrameSlack-3 || len(got[2]) != maxMsg {
		t.Fatalf("next message: %d frames", len(got))
	}
	if cap(in.fr.buf) > maxMsg+FrameSlack {
		t.Fatalf("the buffer grew to %d bytes, past the %d a message may have", cap(in.fr.buf), maxMsg+FrameSlack)
	}
}

// drainOnce receives what in has queued until a receive finds nothing,
// as a stream's owner does before it waits again.
func drainOnce(t *testing.T, in *watched) {
	t.Helper()
	for {
		m, err := in.recv()
		if err != nil {
			t.Fatal(err)
		}
		if m == nil {
			return
		}
	}
}

// TestReceiveBuffersGoBackToThePool: a socket that received a large
// message (a snapshot's reply batch) gives its buffer back to the
// context's pool at the first receive that finds nothing, so sockets
// that take turns, as a calibration round's snapshots do, share one
// buffer instead of holding one each (R-CFG-2). A socket whose limit is
// below a pooled buffer does not take it, and the pool keeps at most
// poolBuffers.
func TestReceiveBuffersGoBackToThePool(t *testing.T) {
	c := pubTestContext(t)
	const sockets = poolBuffers + 4
	batch := 200 << 10
	var shared *byte
	for i := range sockets {
		push, in := framePair(t, c)
		msg := [][]byte{[]byte("seq"), bytes.Repeat([]byte{byte(i)}, batch)}
		sendFrames(t, push, msg)
		got := recvFrames(t, in)
		if len(got) != 2 || !bytes.Equal(got[1], msg[1]) {
			t.Fatalf("socket %d: received %d frames, or the wrong bytes", i, len(got))
		}
		p := unsafe.SliceData(got[0])
		if i == 0 {
			shared = p
		} else if p != shared {
			t.Fatalf("socket %d received into a buffer of its own, not the one socket 0 gave back", i)
		}
		drainOnce(t, in)
		if cap(in.fr.buf) != 0 {
			t.Fatalf("socket %d keeps a buffer of %d bytes after finding nothing queued", i, cap(in.fr.buf))
		}
		if n := c.bufs.held(); n != 1 {
			t.Fatalf("after socket %d: the pool holds %d buffers, want 1", i, n)
		}
	}

	// A socket whose messages may have at most 64 KiB and FrameSlack
	// grows its own buffer rather than take the pool's, which is larger.
	push, small := framePair(t, c)
	if err := small.setMaxMessage(64 << 10); err != nil {
		t.Fatal(err)
	}
	sendFrames(t, push, [][]byte{make([]byte, 100<<10)})
	if got := recvFrames(t, small); len(got) != 1 || len(got[0]) != 100<<10 {
		t.Fatalf("received %d frames", len(got))
	}
	if cap(small.fr.buf) > 64<<10+FrameSlack {
		t.Fatalf("a socket limited to %d bytes took a buffer of %d", 64<<10+FrameSlack, cap(small.fr.buf))
	}
	if n := c.bufs.held(); n != 1 {
		t.Fatalf("the pool holds %d buffers, want the 1 the limited socket left alone", n)
	}

	// Sockets that hold their buffers at once give them all back, and
	// the pool keeps poolBuffers of them.
	var ins []*watched
	for i := range sockets {
		push, in := framePair(t, c)
		sendFrames(t, push, [][]byte{bytes.Repeat([]byte{byte(i)}, batch)})
		recvFrames(t, in)
		ins = append(ins, in)
	}
	for _, in := range ins {
		drainOnce(t, in)
	}
	if n := c.bufs.held(); n != poolBuffers {
		t.Fatalf("the pool holds %d buffers after %d were given back, want %d", n, sockets, poolBuffers)
	}
}
