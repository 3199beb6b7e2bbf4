package main

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// vocab is the width of the random token ids: Qwen3's vocabulary, so the
// ids take as many digits as a real prompt's.
const vocab = 151936

// prompts holds distinct completion bodies of random token ids, sent in
// turn: no two requests in a row share a prefix, and the set is larger
// than any CPU cache, so kvcar parses cold bytes as it would real ones.
type prompts struct {
	bodies [][]byte
	stream bool // the answers are SSE streams, which end with "data: [DONE]"
	next   atomic.Uint64
}

func newPrompts(n, ids int, seed uint64, maxTokens int, stream bool) *prompts {
	rng := rand.New(rand.NewPCG(seed, uint64(ids)))
	p := &prompts{bodies: make([][]byte, n), stream: stream}
	for i := range p.bodies {
		b := make([]byte, 0, 96+8*ids)
		b = append(b, `{"model":"load","max_tokens":`...)
		b = strconv.AppendInt(b, int64(maxTokens), 10)
		if stream {
			b = append(b, `,"stream":true`...)
		}
		b = append(b, `,"prompt":[`...)
		for j := range ids {
			if j > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendUint(b, uint64(rng.IntN(vocab)), 10)
		}
		p.bodies[i] = append(b, "]}"...)
	}
	return p
}

func (p *prompts) take() []byte {
	return p.bodies[(p.next.Add(1)-1)%uint64(len(p.bodies))]
}

// tally is what the clients of one cell saw in its measured window.
type tally struct {
	lat      []time.Duration // of the answered (200) requests
	byStatus map[int]int     // non-200 answers
	connErr  int             // no answer at all
	// cut counts 200 answers that did not end as they must: a stream
	// without its "data: [DONE]", a body that is not a JSON object.
	cut int
}

func (t *tally) add(o *tally) {
	t.lat = append(t.lat, o.lat...)
	for s, n := range o.byStatus {
		t.byStatus[s] += n
	}
	t.connErr += o.connErr
	t.cut += o.cut
}

// quantile of the sorted latencies.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

// newClient returns a client with a connection for every one of c
// concurrent requests to each target, kept alive across the run.
func newClient(c int) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConns:        4 * c,
		MaxIdleConnsPerHost: c,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}}
}

// closedLoop runs c clients, each sending its next request when the last
// is answered, to targets in turn, from now until warmup+window has
// passed. Only the requests sent after warmup and answered before its end
// count; onWindow is called when the window starts and when it ends.
func closedLoop(ctx context.Context, hc *http.Client, targets []string, ps *prompts, c int, warmup, window time.Duration,
	onWindow func(start bool)) *tally {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total = &tally{byStatus: map[int]int{}}
		turn  atomic.Uint64
	)
	t0 := time.Now()
	from, to := t0.Add(warmup), t0.Add(warmup+window)
	ctx, cancel := context.WithDeadline(ctx, to.Add(30*time.Second))
	defer cancel()
	// The window's edges are marked by a goroutine of their own so that
	// what is read there (kvcar's CPU time) is read on time.
	edges := make(chan struct{})
	go func() {
		defer close(edges)
		for i, at := range []time.Time{from, to} {
			select {
			case <-time.After(time.Until(at)):
				onWindow(i == 0)
			case <-ctx.Done():
				return
			}
		}
	}()
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			own := &tally{byStatus: map[int]int{}}
			buf := make([]byte, 4<<10)
			for {
				sent := time.Now()
				if !sent.Before(to) || ctx.Err() != nil {
					break
				}
				target := targets[(turn.Add(1)-1)%uint64(len(targets))]
				status, whole := send(ctx, hc, target, ps.take(), ps.stream, buf)
				done := time.Now()
				if sent.Before(from) || done.After(to) {
					continue
				}
				switch {
				case status == http.StatusOK && !whole:
					own.cut++
				case status == http.StatusOK:
					own.lat = append(own.lat, done.Sub(sent))
				case status == 0:
					own.connErr++
				default:
					own.byStatus[status]++
				}
			}
			mu.Lock()
			total.add(own)
			mu.Unlock()
		}()
	}
	wg.Wait()
	<-edges
	slices.Sort(total.lat)
	return total
}

// send posts body to target and reads the whole answer; it returns the
// status, or 0 when no answer came, and whether the answer ended as it
// must: with "data: [DONE]" when stream, else as a JSON object.
func send(ctx context.Context, hc *http.Client, target string, body []byte, stream bool, buf []byte) (int, bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return 0, false
	}
	req.Header["Content-Type"] = []string{"application/json"}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, false
	}
	var t tail
	_, err = io.CopyBuffer(&t, resp.Body, buf)
	resp.Body.Close()
	if err != nil {
		return 0, false
	}
	end := bytes.TrimRight(t.last(), " \r\n")
	if stream {
		return resp.StatusCode, bytes.HasSuffix(end, []byte("data: [DONE]"))
	}
	return resp.StatusCode, bytes.HasSuffix(end, []byte("}"))
}

// tail keeps the last bytes written to it.
type tail struct {
	b [32]byte
	n int // bytes written in all
}

func (t *tail) Write(p []byte) (int, error) {
	if len(p) >= len(t.b) {
		copy(t.b[:], p[len(p)-len(t.b):])
	} else {
		copy(t.b[:], t.b[len(p):])
		copy(t.b[len(t.b)-len(p):], p)
	}
	t.n += len(p)
	return len(p), nil
}

func (t *tail) last() []byte { return t.b[len(t.b)-min(t.n, len(t.b)):] }
