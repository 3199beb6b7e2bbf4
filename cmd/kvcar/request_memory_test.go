package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/devcluster"
	"github.com/kvcar/kvcar/internal/enginesim"
)

// oversizeIDs and oversizeBytes are the hostile completion of issue 10:
// a 60 MB body of 30 M prompt ids.
const (
	oversizeIDs   = 30_000_000
	oversizeBytes = int64(len(`{"model":"m","prompt":[`)) + 2*oversizeIDs - 1 + int64(len(`]}`))
)

// requestGrowthBound is what the oversize requests may add to kvcar's
// resident memory, four at once: each is rejected at the 1 M id limit
// (about 2 MB of body and 4 MiB of ids) or before reading at the body
// limit, so 4 × 6 MiB plus the garbage collector's headroom stays well
// under it. Before the request path was bounded they added ~1 GiB.
const requestGrowthBound = 96 << 20

// TestOversizeCompletionMemoryBound covers issue 10 item 1: completions
// of 60 MB and 30 M ids each, one alone and then four at once with and
// without a Content-Length, are refused with a status naming the limit, and kvcar,
// running as its own process, grows its resident memory by less than
// requestGrowthBound (its peak, VmHWM, reset just before) while staying
// able to serve.
func TestOversizeCompletionMemoryBound(t *testing.T) {
	if testing.Short() {
		t.Skip("runs kvcar as a process and sends it 480 MB")
	}
	etcd := startEtcd(t)
	engines, err := devcluster.StartEngines([]enginesim.Config{
		devcluster.Discoverable(enginesim.Config{BlockSize: 16, DeviceBlocks: 64}, etcd.Endpoints(), "", 100*time.Millisecond),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { engines.Close() })
	cfgPath, err := devcluster.WriteConfig(t.TempDir(), devcluster.DiscoveryConfig(16, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	kv := startKVCarProcess(t, etcd.Endpoints(), cfgPath)
	if err := kv.WaitSynced(t.Context(), engines.Streams(), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := engines.WaitHeartbeats(t.Context(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(kv.URL(), "http://")
	// A normal request first, so that the request path's pools and the
	// engine connection exist before the baseline.
	if code, body := rawCompletion(t, addr, strings.NewReader(idsPrompt(1, 64)), int64(len(idsPrompt(1, 64)))); code != http.StatusOK {
		t.Fatalf("normal completion: %d %s", code, body)
	}

	pid := kv.Pid()
	// One request alone, then four at once with and without a
	// Content-Length.
	for _, phase := range []struct {
		name    string
		lengths []int64
		clients int
	}{
		{"one completion with Content-Length, then one chunked", []int64{oversizeBytes, -1}, 1},
		{"4 at once with Content-Length, then 4 at once chunked", []int64{oversizeBytes, -1}, 4},
	} {
		// "5" resets VmHWM to the current RSS, so the peak read
		// afterwards is the peak of these requests alone.
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
			t.Fatal(err)
		}
		base, _, err := devcluster.Memory(pid)
		if err != nil {
			t.Fatal(err)
		}
		cpu0, err := devcluster.CPUTime(pid)
		if err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		for _, length := range phase.lengths {
			var wg sync.WaitGroup
			for range phase.clients {
				wg.Go(func() {
					code, body := rawCompletion(t, addr, newIDsBody(oversizeIDs), length)
					if code != http.StatusBadRequest && code != http.StatusRequestEntityTooLarge {
						t.Errorf("60 MB completion (Content-Length %d): %d %s", length, code, body)
					} else if !strings.Contains(body, "1048576") && !strings.Contains(body, "16777216") {
						t.Errorf("60 MB completion (Content-Length %d): %d does not name the limit: %s", length, code, body)
					}
				})
			}
			wg.Wait()
		}
		took := time.Since(began)
		_, peak, err := devcluster.Memory(pid)
		if err != nil {
			t.Fatal(err)
		}
		cpu1, err := devcluster.CPUTime(pid)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s, each %d bytes of %d ids, in %v: kvcar RSS %.1f MiB before, peak %.1f MiB (+%.1f MiB, bound +%d MiB), CPU %v",
			phase.name, oversizeBytes, oversizeIDs, took.Round(time.Millisecond), float64(base)/(1<<20), float64(peak)/(1<<20),
			float64(peak-base)/(1<<20), requestGrowthBound>>20, (cpu1 - cpu0).Round(time.Millisecond))
		if peak-base > requestGrowthBound {
			t.Errorf("%s: kvcar's peak RSS grew by %d bytes, over the bound %d", phase.name, peak-base, requestGrowthBound)
		}
	}
	if code, body := rawCompletion(t, addr, strings.NewReader(idsPrompt(1, 64)), int64(len(idsPrompt(1, 64)))); code != http.StatusOK {
		t.Fatalf("normal completion after the oversize ones: %d %s", code, body)
	}
}

// rawCompletion posts body to /v1/completions over a connection of its
// own, chunked when length is -1, and reads the answer while the body is
// still being written: kvcar answers an oversize body before reading it
// all, and a client that waited for its own write to finish would see a
// reset instead of the answer.
func rawCompletion(t *testing.T, addr string, body io.Reader, length int64) (int, string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Error(err)
		return 0, ""
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Minute))
	head := "POST /v1/completions HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\nConnection: close\r\n"
	if length >= 0 {
		head += "Content-Length: " + strconv.FormatInt(length, 10) + "\r\n\r\n"
	} else {
		head += "Transfer-Encoding: chunked\r\n\r\n"
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		w := bufio.NewWriterSize(conn, 64<<10)
		if _, err := w.WriteString(head); err != nil {
			return
		}
		if length >= 0 {
			_, _ = io.Copy(w, body)
			_ = w.Flush()
			return
		}
		cw := chunkWriter{w}
		buf := make([]byte, 32<<10)
		if _, err := io.CopyBuffer(cw, body, buf); err != nil {
			return
		}
		_, _ = w.WriteString("0\r\n\r\n")
		_ = w.Flush()
	})
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Errorf("reading the answer: %v", err)
		conn.Close()
		return 0, ""
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	// Stops the writer of a body kvcar refused.
	conn.Close()
	return resp.StatusCode, string(b)
}

// chunkWriter frames each write as one HTTP/1.1 chunk.
type chunkWriter struct{ w *bufio.Writer }

func (c chunkWriter) Write(p []byte) (int, error) {
	if _, err := fmt.Fprintf(c.w, "%x\r\n", len(p)); err != nil {
		return 0, err
	}
	if _, err := c.w.Write(p); err != nil {
		return 0, err
	}
	_, err := c.w.WriteString("\r\n")
	return len(p), err
}

// idsBody generates {"model":"m","prompt":[1,1,...,1]} with n ids without
// holding it in memory.
type idsBody struct {
	head, tail string
	left       int
	started    bool
}

func newIDsBody(n int) *idsBody {
	return &idsBody{head: `{"model":"m","prompt":[`, tail: `]}`, left: n}
}

func (b *idsBody) Read(p []byte) (int, error) {
	n := 0
	if !b.started {
		n = copy(p, b.head)
		b.head = b.head[n:]
		if b.head != "" {
			return n, nil
		}
		b.started = true
	}
	for b.left > 0 && n+2 <= len(p) {
		p[n] = '1'
		n++
		b.left--
		if b.left > 0 {
			p[n] = ','
			n++
		}
	}
	if b.left > 0 {
		return n, nil
	}
	k := copy(p[n:], b.tail)
	b.tail = b.tail[k:]
	n += k
	if b.tail == "" {
		return n, io.EOF
	}
	return n, nil
}
