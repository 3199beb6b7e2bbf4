package kvtransport

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// BenchmarkLiveReceiveHWM measures what a small receive HWM costs the
// live channel: a publisher sends as fast as it can, the subscriber
// drains as kvdir does (poll, then read until empty), and the benchmark
// reports the share of messages delivered and the cost per delivered
// one. The receive HWM bounds the bytes libzmq may queue per stream
// (HWM × max_message_bytes), so it must be small; past it libzmq stops
// reading the socket and the engine's own send HWM decides what drops.
func BenchmarkLiveReceiveHWM(b *testing.B) {
	for _, size := range []int{512, 64 << 10} {
		for _, hwm := range []int{1, 2, 8, 1000, 10000} {
			b.Run(fmt.Sprintf("msg=%dB/hwm=%d", size, hwm), func(b *testing.B) {
				benchLiveHWM(b, size, hwm)
			})
		}
	}
}

func benchLiveHWM(b *testing.B, size, hwm int) {
	c, err := NewContext()
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	p, err := c.BindPublisher("tcp://127.0.0.1:0", PublisherOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	s, err := c.Subscribe(p.Endpoint(), "", SubscriberOptions{ReceiveHWM: hwm, MaxMessageBytes: int64(size) + 1024})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	pubWaitSubscribed(b, p, 1, s)
	payload := make([]byte, size)
	sent := make(chan error, 1)
	b.SetBytes(int64(size))
	b.ResetTimer()
	start := time.Now()
	lastAt := start
	go func() {
		// The publisher belongs to this goroutine until it sends on sent.
		var err error
		for i := 0; i < b.N && err == nil; i++ {
			err = p.Send([][]byte{{}, seq8(uint64(i)), payload})
		}
		sent <- err
	}()
	got, done := 0, false
	quietSince := time.Time{}
	for {
		rd, err := s.Wait(nil, 20*time.Millisecond)
		if err != nil {
			b.Fatal(err)
		}
		if rd.Live {
			for {
				m, err := s.RecvLive()
				if err != nil {
					b.Fatal(err)
				}
				if m == nil {
					break
				}
				got++
			}
			lastAt = time.Now()
			quietSince = time.Time{}
		}
		if !done {
			select {
			case err := <-sent:
				if err != nil {
					b.Fatal(err)
				}
				done = true
			default:
			}
		}
		if done && got == b.N {
			break
		}
		if done && !rd.Live {
			if quietSince.IsZero() {
				quietSince = time.Now()
			} else if time.Since(quietSince) > 200*time.Millisecond {
				break
			}
		}
	}
	b.StopTimer()
	if got == 0 {
		b.Fatal("nothing delivered")
	}
	b.ReportMetric(100*float64(got)/float64(b.N), "%delivered")
	b.ReportMetric(float64(lastAt.Sub(start).Nanoseconds())/float64(got), "ns/delivered")
}

// BenchmarkLiveWake is one live message at a time: the publisher sends
// when the subscriber has taken the last one, so every message costs a
// wake-up, the checks of the subscriber's sockets (its live socket, its
// monitor, its waker and a replayer's dealer, as a stream has during a
// snapshot) and the receive that finds the socket empty again. It
// reports the process's CPU per message besides the round trip.
func BenchmarkLiveWake(b *testing.B) {
	c := pubTestContext(b)
	p, rs, _, s := subscribedStream(b, c, "")
	r, err := c.DialReplay(rs.Endpoint(), ReplayOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	took := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for got := 0; got < b.N; {
			rd, err := s.Wait(r, time.Second)
			if err != nil {
				done <- err
				return
			}
			for rd.Link {
				if _, ok, err := s.RecvLink(); err != nil || !ok {
					break
				}
			}
			for rd.Live {
				m, err := s.RecvLive()
				if err != nil {
					done <- err
					return
				}
				if m == nil {
					break
				}
				got++
				took <- struct{}{}
			}
		}
		done <- nil
	}()
	payload := make([]byte, 512)
	cpu0 := processCPU(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := p.Send([][]byte{{}, seq8(uint64(i)), payload}); err != nil {
			b.Fatal(err)
		}
		select {
		case <-took:
		case err := <-done:
			b.Fatalf("receiver ended early: %v", err)
		case <-time.After(5 * time.Second):
			b.Fatal("message not received in 5 s")
		}
	}
	b.StopTimer()
	b.ReportMetric(float64((processCPU(b)-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/msg")
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

// processCPU is the CPU time, user and system, this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkReceive measures taking one queued message of three frames
// (topic, sequence, payload of msg= bytes: a decode step's live message,
// a large one, a snapshot reply batch of 512 blocks) off a socket,
// through the package's receive (path=reuse) and through pebbe/zmq4's
// RecvMessageBytes (path=pebbe), which allocates every frame. Messages
// are sent 256 at a time outside the timed part, and a receive that finds
// none queued yet waits outside it too.
func BenchmarkReceive(b *testing.B) {
	for _, size := range []int{512, 64 << 10, 200 << 10} {
		for _, path := range []string{"reuse", "pebbe"} {
			b.Run(fmt.Sprintf("msg=%dB/path=%s", size, path), func(b *testing.B) {
				benchReceive(b, size, path == "pebbe")
			})
		}
	}
}

func benchReceive(b *testing.B, size int, pebbe bool) {
	c := pubTestContext(b)
	pull, err := c.newSocket(zmq.PULL)
	if err != nil {
		b.Fatal(err)
	}
	in := c.watch(pull, true)
	defer in.Close()
	if err := pull.SetRcvhwm(0); err != nil {
		b.Fatal(err)
	}
	if err := pull.Bind("tcp://127.0.0.1:*"); err != nil {
		b.Fatal(err)
	}
	ep, err := pull.GetLastEndpoint()
	if err != nil {
		b.Fatal(err)
	}
	push, err := c.newSocket(zmq.PUSH)
	if err != nil {
		b.Fatal(err)
	}
	defer push.Close()
	if err := push.SetSndhwm(0); err != nil {
		b.Fatal(err)
	}
	if err := push.Connect(ep); err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	const chunk = 256
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; {
		b.StopTimer()
		n := min(chunk, b.N-done)
		for i := range n {
			if _, err := push.SendMessage("kv-events", seq8(uint64(done+i)), payload); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		for i := 0; i < n; {
			var m [][]byte
			var err error
			if pebbe {
				m, err = pull.RecvMessageBytes(zmq.DONTWAIT)
			} else if m, err = in.recv(); m == nil && err == nil {
				err = zmq.Errno(syscall.EAGAIN)
			}
			if err != nil {
				if !isAgain(err) {
					b.Fatal(err)
				}
				// Not queued yet: the wait is not the receive's.
				b.StopTimer()
				if _, err := pollOne(pull, time.Second); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				continue
			}
			if len(m) != 3 || len(m[2]) != size {
				b.Fatalf("received %d frames", len(m))
			}
			i++
		}
		done += n
	}
}
