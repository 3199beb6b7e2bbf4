package kvtransport

import (
	"sync"
	"testing"
	"time"
)

// Every wake ends a wait: an engine loop that waits on its sockets for up
// to a second must see each command at once, however wakes from many
// goroutines interleave with its drains.
func TestWakerNeverLosesAWake(t *testing.T) {
	c := pubTestContext(t)
	p, rs, w := engineSockets(t, c)

	const senders, each = 8, 500
	cmds := make(chan int, senders*each)
	var wg sync.WaitGroup
	for range senders {
		wg.Go(func() {
			for i := range each {
				cmds <- i
				if err := w.Wake(); err != nil {
					t.Error(err)
					return
				}
				if i%50 == 0 {
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
	got, slowest := 0, time.Duration(0)
	for got < senders*each {
		began := time.Now()
		if _, err := rs.Wait(p, w, 2*time.Second); err != nil {
			t.Fatal(err)
		}
		took := time.Since(began)
		n := 0
		for drained := false; !drained; {
			select {
			case <-cmds:
				n++
			default:
				drained = true
			}
		}
		if took >= 2*time.Second {
			// Commands remained to be sent, each followed by a wake.
			t.Fatalf("wait ran to its timeout with %d of %d commands taken, %d queued: a wake was lost", got, senders*each, n)
		}
		got += n
		slowest = max(slowest, took)
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Wake(); err != nil {
		t.Fatalf("wake after close: %v", err)
	}
	t.Logf("%d commands, longest wait %v", got, slowest)
}

// engineSockets binds an engine's publisher and replay server on loopback
// and makes a waker, all closed when the test ends.
func engineSockets(t testing.TB, c *Context) (*Publisher, *ReplayServer, *Waker) {
	t.Helper()
	p, err := c.BindPublisher("tcp://127.0.0.1:0", PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rs, err := c.BindReplayServer("tcp://127.0.0.1:0", ReplayServerOptions{})
	if err != nil {
		p.Close()
		t.Fatal(err)
	}
	w, err := c.NewWaker()
	if err != nil {
		p.Close()
		rs.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		w.Close()
		rs.Close()
		p.Close()
	})
	return p, rs, w
}
