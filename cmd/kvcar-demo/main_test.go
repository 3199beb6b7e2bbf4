package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/devcluster"
)

// lockedBuffer collects the demo's output, which kvcar's output copiers
// write from their own goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestDemoRoutesChatWithTokenizer runs the demo as make run does with a
// tokenizer (here the small Qwen2-style fixture, whose chat template is
// Qwen's): kvcar tokenizes the multi-turn chat and text requests, and the
// engines reuse cached prefixes of them (R-CAR-2).
func TestDemoRoutesChatWithTokenizer(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	bin, err := devcluster.BuildKVCar(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var out lockedBuffer
	err = run(ctx, []string{"--kvcar=" + bin, "--port=0", "--requests=3", "--duration=1ms",
		"--tokenizer_path=../../internal/tokenizer/testdata/qwen2like"}, &out)
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	m := regexp.MustCompile(`(\d+) chat and text requests, (\d+) prompt tokens: the engines reused (\d+)`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no chat summary in the output:\n%s", out.String())
	}
	requests, _ := strconv.Atoi(m[1])
	prompt, _ := strconv.Atoi(m[2])
	reused, _ := strconv.Atoi(m[3])
	if requests != 16 || reused <= 0 || reused > prompt {
		t.Fatalf("chat workload: %d requests, %d prompt tokens, %d reused; want 16 requests and some reuse:\n%s", requests, prompt, reused, out.String())
	}
	t.Logf("%d chat and text requests, %d prompt tokens, %d reused", requests, prompt, reused)
}
