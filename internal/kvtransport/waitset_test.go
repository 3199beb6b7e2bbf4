package kvtransport

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// osThreads is the number of threads of this process.
func osThreads(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no Threads line in /proc/self/status")
	return 0
}

// Subscribers waiting for messages hold no thread each: a process
// following hundreds of streams must not run a thread per stream that
// each message wakes and that must win back a CPU from the request path.
// Every waiting subscriber still gets its message at once.
func TestWaitingSubscribersHoldNoThread(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("waits park in Go's poller on Linux only")
	}
	c := pubTestContext(t)
	p, err := c.BindPublisher("tcp://127.0.0.1:0", PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const n = 64
	subs := make([]*Subscriber, n)
	for i := range subs {
		if subs[i], err = c.Subscribe(p.Endpoint(), "t", SubscriberOptions{}); err != nil {
			t.Fatal(err)
		}
		defer subs[i].Close()
	}
	pubWaitSubscribed(t, p, n, subs...)
	before := osThreads(t)

	got := make(chan struct{}, n)
	var wg sync.WaitGroup
	waiting := make(chan struct{}, n)
	for _, s := range subs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			waiting <- struct{}{}
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) {
				rd, err := s.Wait(nil, time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				for rd.Link {
					if _, ok, err := s.RecvLink(); err != nil || !ok {
						break
					}
				}
				if !rd.Live {
					continue
				}
				if m, err := s.RecvLive(); err != nil || m == nil {
					t.Errorf("Wait said live, receive gave %v, %v", m, err)
					return
				}
				got <- struct{}{}
				return
			}
			t.Error("no message within 10 s")
		}()
	}
	for range n {
		<-waiting
	}
	time.Sleep(300 * time.Millisecond) // every goroutine is in its wait
	during := osThreads(t)
	if err := p.Send([][]byte{[]byte("t"), seq8(1), {1}}); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if len(got) != n {
		t.Fatalf("%d of %d subscribers got the message", len(got), n)
	}
	// A thread per waiting subscriber would add 64.
	t.Logf("threads before %d, during %d", before, during)
	if during-before > 8 {
		t.Errorf("%d subscribers waiting took %d threads (from %d to %d)", n, during-before, before, during)
	}
}

// A wait reports each input it watches and no other: the live socket,
// a replayer's dealer swapped in and out between waits (and replaced
// after it was closed), and a waker, which ends the wait with nothing to
// read; with nothing at all it lasts its timeout.
func TestWaitReportsEachInput(t *testing.T) {
	c := pubTestContext(t)
	p, rs, w, s := subscribedStream(t, c, "t")
	for { // the link event of the connection
		rd, err := s.Wait(nil, 100*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if !rd.Link {
			break
		}
		for {
			if _, ok, err := s.RecvLink(); err != nil || !ok {
				break
			}
		}
	}

	start := time.Now()
	if rd, err := s.Wait(nil, 200*time.Millisecond); err != nil || rd.Any() {
		t.Fatalf("idle wait: %+v, %v", rd, err)
	}
	if took := time.Since(start); took < 180*time.Millisecond || took > 2*time.Second {
		t.Errorf("idle wait of 200ms took %v", took)
	}

	if err := w.Wake(); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if rd, err := s.Wait(nil, 5*time.Second); err != nil || rd.Any() {
		t.Fatalf("woken wait: %+v, %v", rd, err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("a woken wait took %v", took)
	}
	if rd, err := s.Wait(nil, 50*time.Millisecond); err != nil || rd.Any() {
		t.Fatalf("the wake was not drained: %+v, %v", rd, err)
	}

	if err := p.Send([][]byte{[]byte("t"), seq8(1), {1}}); err != nil {
		t.Fatal(err)
	}
	if rd, err := s.Wait(nil, 5*time.Second); err != nil || !rd.Live || rd.Replay {
		t.Fatalf("after a message: %+v, %v", rd, err)
	}
	if m, err := s.RecvLive(); err != nil || len(m) != 3 {
		t.Fatalf("live message %x, %v", m, err)
	}

	for round := range 3 {
		r, err := c.DialReplay(rs.Endpoint(), ReplayOptions{})
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for r.Send([][]byte{{}, seq8(uint64(round))}) != nil {
			if time.Now().After(deadline) {
				t.Fatal("replay link not up in 5 s")
			}
			if _, err := s.Wait(r, 10*time.Millisecond); err != nil {
				t.Fatal(err)
			}
		}
		id, _, err := rs.Recv(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if rd, err := s.Wait(r, 50*time.Millisecond); err != nil || rd.Any() {
			t.Fatalf("round %d, before the reply: %+v, %v", round, rd, err)
		}
		if err := rs.Reply(id, [][]byte{{}, seq8(uint64(round)), {2}}); err != nil {
			t.Fatal(err)
		}
		if rd, err := s.Wait(r, 5*time.Second); err != nil || !rd.Replay || rd.Live {
			t.Fatalf("round %d, after the reply: %+v, %v", round, rd, err)
		}
		if m, err := r.Recv(); err != nil || len(m) != 3 {
			t.Fatalf("reply %x, %v", m, err)
		}
		if round == 1 {
			// Closed while still in the wait set: the next wait drops it.
			r.Close()
			continue
		}
		if rd, err := s.Wait(nil, 20*time.Millisecond); err != nil || rd.Any() {
			t.Fatalf("round %d, without the replayer: %+v, %v", round, rd, err)
		}
		r.Close()
	}
}

// A wait asks libzmq only about the sockets that may have input: none
// while nothing arrives, the live socket for a live message. A socket
// left with input (its owner stopped receiving before it was empty) is
// still reported by every wait until it is drained, and a message that
// arrives meanwhile on a socket known empty is reported too.
func TestWaitAsksOnlySocketsThatMayHaveInput(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("signal descriptors are looked at on Linux only")
	}
	c := pubTestContext(t)
	p, rs, _, s := subscribedStream(t, c, "t")
	r, err := c.DialReplay(rs.Endpoint(), ReplayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// Drain everything the connections brought.
	for {
		rd, err := s.Wait(r, 100*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if !rd.Any() {
			break
		}
		for rd.Link {
			if _, ok, err := s.RecvLink(); err != nil || !ok {
				break
			}
		}
	}

	before := s.ws.asks
	for range 5 {
		if rd, err := s.Wait(r, 20*time.Millisecond); err != nil || rd.Any() {
			t.Fatalf("idle wait: %+v, %v", rd, err)
		}
	}
	if n := s.ws.asks - before; n != 0 {
		t.Errorf("5 idle waits asked %d sockets, want 0", n)
	}

	for i := range 3 {
		if err := p.Send([][]byte{[]byte("t"), seq8(uint64(i)), {1}}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(50 * time.Millisecond) // all three queued
	before = s.ws.asks
	if rd, err := s.Wait(r, 5*time.Second); err != nil || !rd.Live || rd.Replay || rd.Link {
		t.Fatalf("after messages: %+v, %v", rd, err)
	}
	// The live socket, and the waker's end only if libzmq signalled it.
	if n := s.ws.asks - before; n < 1 || n > 2 {
		t.Errorf("a wait after live messages asked %d sockets, want 1 or 2", n)
	}
	for i := range 3 {
		if m, err := s.RecvLive(); err != nil || len(m) != 3 {
			t.Fatalf("message %d: %x, %v", i, m, err)
		}
		// One taken, the rest still queued: every wait reports them, and
		// a reply arriving on the replayer, known empty, is reported too.
		if i == 0 {
			if err := r.Send([][]byte{{}, seq8(1)}); err != nil {
				t.Fatal(err)
			}
			id, _, err := rs.Recv(5 * time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if err := rs.Reply(id, [][]byte{{}, seq8(1), {2}}); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				rd, err := s.Wait(r, time.Second)
				if err != nil || !rd.Live {
					t.Fatalf("live input left queued not reported: %+v, %v", rd, err)
				}
				if rd.Replay {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("reply not reported in 5 s")
				}
			}
			if m, err := r.Recv(); err != nil || len(m) != 3 {
				t.Fatalf("reply %x, %v", m, err)
			}
		} else if rd, err := s.Wait(r, time.Second); err != nil || rd.Live != (i < 2) {
			t.Fatalf("after message %d of 3: %+v, %v", i, rd, err)
		}
	}
	if m, err := s.RecvLive(); err != nil || m != nil {
		t.Fatalf("a fourth message: %x, %v", m, err)
	}
}

// subscribedStream binds an engine's sockets and subscribes to topic with
// a waker, as a stream does, and waits until the engine has the
// subscription; everything is closed when the test ends.
func subscribedStream(tb testing.TB, c *Context, topic string) (*Publisher, *ReplayServer, *Waker, *Subscriber) {
	tb.Helper()
	p, rs, w := engineSockets(tb, c)
	s, err := c.Subscribe(p.Endpoint(), topic, SubscriberOptions{Waker: w})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	pubWaitSubscribed(tb, p, 1, s)
	return p, rs, w, s
}
