package leakcheck

import (
	"strings"
	"testing"
	"time"
)

//go:noinline
func parkedUntil(stop chan struct{}) { <-stop }

// A goroutine started after the baseline and still blocked is reported
// with its stack; once it ends, nothing is.
func TestLeakedFindsParkedGoroutine(t *testing.T) {
	before := Baseline()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		parkedUntil(stop)
	}()
	got := Leaked(before, Grace(50*time.Millisecond))
	if !strings.Contains(got, "leakcheck.parkedUntil") || !strings.Contains(got, "created by") {
		t.Fatalf("leak not reported:\n%s", got)
	}
	close(stop)
	<-done
	if got := Leaked(before, Grace(time.Second)); got != "" {
		t.Fatalf("an ended goroutine reported:\n%s", got)
	}
}

// The wait lasts until a goroutine ends within the grace period.
func TestLeakedWaitsForSlowShutdown(t *testing.T) {
	before := Baseline()
	go time.Sleep(100 * time.Millisecond)
	if got := Leaked(before, Grace(5*time.Second)); got != "" {
		t.Fatalf("a goroutine ending within the grace period reported:\n%s", got)
	}
}

// Ignores match the top function or the creator exactly, nothing else.
func TestIgnores(t *testing.T) {
	before := Baseline()
	stop := make(chan struct{})
	defer close(stop)
	go parkedUntil(stop)
	if got := Leaked(before, Grace(20*time.Millisecond), IgnoreTop("github.com/kvcar/kvcar/internal/leakcheck.parkedUntil")); got != "" {
		t.Errorf("IgnoreTop did not ignore:\n%s", got)
	}
	if got := Leaked(before, Grace(20*time.Millisecond), IgnoreTop("github.com/kvcar/kvcar/internal/leakcheck.parked")); got == "" {
		t.Error("IgnoreTop matched a prefix of the function")
	}
	if got := Leaked(before, Grace(20*time.Millisecond), IgnoreCreatedBy("github.com/kvcar/kvcar/internal/leakcheck.TestIgnores")); got != "" {
		t.Errorf("IgnoreCreatedBy did not ignore:\n%s", got)
	}
}

func TestParse(t *testing.T) {
	block := `goroutine 42 [chan receive, 3 minutes]:
example.com/p.(*T).wait(0xc000010000, {0x1, 0x2})
	/src/p/p.go:12 +0x1d
example.com/p.run[...](...)
	/src/p/p.go:20
created by example.com/p.Start in goroutine 7
	/src/p/p.go:30 +0x5a`
	g, ok := parse(block)
	if !ok || g.id != 42 || g.top != "example.com/p.(*T).wait" || g.createdBy != "example.com/p.Start" {
		t.Fatalf("parse = %+v, %v", g, ok)
	}
	if _, ok := parse("not a goroutine"); ok {
		t.Error("parsed garbage")
	}
}
