package kvtransport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

func pubTestContext(t testing.TB) *Context {
	t.Helper()
	c, err := NewContext()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close context: %v", err)
		}
	})
	return c
}

// pubTestPeer opens a plain libzmq socket on c's context, the way kvcar's
// own SUB and DEALER sides do, so these tests exercise only the engine side.
func pubTestPeer(t *testing.T, c *Context, typ zmq.Type, endpoint string) *zmq.Socket {
	t.Helper()
	s, err := c.newSocket(typ)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Connect(endpoint); err != nil {
		s.Close()
		t.Fatal(err)
	}
	return s
}

func pubRecv(t *testing.T, s *zmq.Socket, timeout time.Duration) [][]byte {
	t.Helper()
	ok, err := pollOne(s, timeout)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatalf("no message within %v", timeout)
	}
	msg, err := s.RecvMessageBytes(0)
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

// pubWaitSubscribed polls the XPUB until n subscribe requests have arrived,
// so a test never publishes before the subscriber is attached. It polls
// kvcar's subscribers in subs meanwhile: theirs is sent once the
// connection is attached, which libzmq does inside a call on the socket.
func pubWaitSubscribed(t testing.TB, p *Publisher, n uint64, subs ...*Subscriber) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := p.DrainSubscriptions()
		if err != nil {
			t.Fatal(err)
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("saw %d subscriptions, want %d", got, n)
		}
		if len(subs) == 0 {
			time.Sleep(time.Millisecond)
		}
		for _, s := range subs {
			if _, err := s.Wait(nil, time.Millisecond); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func seq8(v uint64) []byte {
	return binary.BigEndian.AppendUint64(nil, v)
}

// R-WIRE-1: a live message leaves the XPUB as topic | seq | payload and a
// SUB on the bound (port 0 → real port) endpoint receives it unchanged.
func TestPublisherLiveFramesRWIRE1(t *testing.T) {
	c := pubTestContext(t)
	p, err := c.BindPublisher("tcp://127.0.0.1:0", PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if strings.HasSuffix(p.Endpoint(), ":0") || !strings.HasPrefix(p.Endpoint(), "tcp://127.0.0.1:") {
		t.Fatalf("endpoint %q does not name the picked port", p.Endpoint())
	}

	sub := pubTestPeer(t, c, zmq.SUB, p.Endpoint())
	defer sub.Close()
	if err := sub.SetSubscribe("xllm-kv"); err != nil {
		t.Fatal(err)
	}
	pubWaitSubscribed(t, p, 1)

	want := [][]byte{[]byte("xllm-kv"), seq8(7), {0x93, 0xcb, 1, 2}}
	if err := p.Send(want); err != nil {
		t.Fatal(err)
	}
	got := pubRecv(t, sub, 5*time.Second)
	if len(got) != len(want) {
		t.Fatalf("got %d frames, want %d", len(got), len(want))
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("frame %d = %x, want %x", i, got[i], want[i])
		}
	}
}

// R-WIRE-1: a second subscriber is counted too, and a message with an
// empty payload frame survives the trip.
func TestPublisherCountsEverySubscriberRWIRE1(t *testing.T) {
	c := pubTestContext(t)
	p, err := c.BindPublisher("tcp://127.0.0.1:0", PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	subs := make([]*zmq.Socket, 2)
	for i := range subs {
		subs[i] = pubTestPeer(t, c, zmq.SUB, p.Endpoint())
		defer subs[i].Close()
		if err := subs[i].SetSubscribe("t"); err != nil {
			t.Fatal(err)
		}
	}
	pubWaitSubscribed(t, p, 2)
	if err := p.Send([][]byte{[]byte("t"), seq8(0), {}}); err != nil {
		t.Fatal(err)
	}
	for i, s := range subs {
		got := pubRecv(t, s, 5*time.Second)
		if len(got) != 3 || len(got[2]) != 0 || binary.BigEndian.Uint64(got[1]) != 0 {
			t.Fatalf("subscriber %d got %x", i, got)
		}
	}
}

// The engine's XPUB drops at its send HWM instead of blocking: a stalled
// subscriber loses messages, which kvcar later sees as a gap (R-REC-3).
func TestPublisherDropsAtHWMRREC3(t *testing.T) {
	c := pubTestContext(t)
	p, err := c.BindPublisher("tcp://127.0.0.1:0", PublisherOptions{SendHWM: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	sub, err := c.newSocket(zmq.SUB)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := sub.SetRcvhwm(2); err != nil {
		t.Fatal(err)
	}
	if err := sub.Connect(p.Endpoint()); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetSubscribe(""); err != nil {
		t.Fatal(err)
	}
	pubWaitSubscribed(t, p, 1)

	const sent = 100
	payload := make([]byte, 256<<10)
	start := time.Now()
	for i := 0; i < sent; i++ {
		if err := p.Send([][]byte{{}, seq8(uint64(i)), payload}); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("sending to a stalled subscriber blocked for %v", d)
	}

	received := 0
	var prev uint64
	for {
		ok, err := pollOne(sub, 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		msg, err := sub.RecvMessageBytes(0)
		if err != nil {
			t.Fatal(err)
		}
		s := binary.BigEndian.Uint64(msg[1])
		if received > 0 && s <= prev {
			t.Fatalf("seq %d after %d: messages reordered", s, prev)
		}
		prev = s
		received++
	}
	if received == 0 || received >= sent {
		t.Fatalf("received %d of %d messages, want some but not all", received, sent)
	}
}

// R-WIRE-3: the ROUTER hands over the DEALER's request [empty, seq8] with
// the peer identity, and Reply routes the answer back to that peer only.
func TestReplayServerRequestReplyRWIRE3(t *testing.T) {
	c := pubTestContext(t)
	r, err := c.BindReplayServer("tcp://127.0.0.1:0", ReplayServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if strings.HasSuffix(r.Endpoint(), ":0") {
		t.Fatalf("endpoint %q does not name the picked port", r.Endpoint())
	}

	dealers := make([]*zmq.Socket, 2)
	for i := range dealers {
		dealers[i] = pubTestPeer(t, c, zmq.DEALER, r.Endpoint())
		defer dealers[i].Close()
		if _, err := dealers[i].SendMessage([]byte{}, seq8(uint64(40+i))); err != nil {
			t.Fatal(err)
		}
	}

	seen := map[uint64][]byte{}
	deadline := time.Now().Add(5 * time.Second)
	for len(seen) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("received %d of 2 requests", len(seen))
		}
		id, frames, err := r.Recv(100 * time.Millisecond)
		if errors.Is(err, ErrTimeout) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(id) == 0 || len(frames) != 2 || len(frames[0]) != 0 || len(frames[1]) != 8 {
			t.Fatalf("request id=%x frames=%x", id, frames)
		}
		seen[binary.BigEndian.Uint64(frames[1])] = id
	}

	for i := range dealers {
		start := uint64(40 + i)
		id := seen[start]
		if id == nil {
			t.Fatalf("no request with start seq %d", start)
		}
		payload := []byte{byte(i + 1)}
		if err := r.Reply(id, [][]byte{{}, seq8(start), payload}); err != nil {
			t.Fatal(err)
		}
		if err := r.Reply(id, [][]byte{{}, seq8(^uint64(0)), {}}); err != nil {
			t.Fatal(err)
		}
	}
	for i, d := range dealers {
		got := pubRecv(t, d, 5*time.Second)
		if len(got) != 3 || binary.BigEndian.Uint64(got[1]) != uint64(40+i) || !bytes.Equal(got[2], []byte{byte(i + 1)}) {
			t.Fatalf("dealer %d got %x", i, got)
		}
		end := pubRecv(t, d, 5*time.Second)
		if len(end) != 3 || binary.BigEndian.Uint64(end[1]) != ^uint64(0) || len(end[2]) != 0 {
			t.Fatalf("dealer %d end marker %x", i, end)
		}
	}
}

// R-REC-5: a wait with nothing to read ends with ErrTimeout, near the
// requested time, and a reply to an unknown peer is dropped, not an error.
func TestReplayServerTimeoutRREC5(t *testing.T) {
	c := pubTestContext(t)
	r, err := c.BindReplayServer("tcp://127.0.0.1:0", ReplayServerOptions{SendHWM: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	start := time.Now()
	_, _, err = r.Recv(20 * time.Millisecond)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("Recv = %v, want ErrTimeout", err)
	}
	if d := time.Since(start); d < 15*time.Millisecond || d > 2*time.Second {
		t.Fatalf("Recv waited %v for a 20ms timeout", d)
	}
	if err := r.Reply([]byte("nobody"), [][]byte{{}, seq8(1), {}}); err != nil {
		t.Fatalf("reply to unknown peer: %v", err)
	}
}

// Binding an endpoint already in use fails with a wrapped error naming it.
func TestBindConflictNamesEndpoint(t *testing.T) {
	c := pubTestContext(t)
	p, err := c.BindPublisher("tcp://127.0.0.1:0", PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	_, err = c.BindReplayServer(p.Endpoint(), ReplayServerOptions{})
	if err == nil || !strings.Contains(err.Error(), p.Endpoint()) {
		t.Fatalf("second bind on %s: err = %v", p.Endpoint(), err)
	}
}

// pollOne waits up to timeout for s to become readable.
func pollOne(s *zmq.Socket, timeout time.Duration) (bool, error) {
	p := zmq.NewPoller()
	p.Add(s, zmq.POLLIN)
	ready, err := p.Poll(timeout)
	if err != nil {
		return false, fmt.Errorf("kvtransport: poll: %w", err)
	}
	return len(ready) > 0, nil
}
