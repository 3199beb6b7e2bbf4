package kvtransport

import (
	"fmt"
	"testing"
	"time"
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
