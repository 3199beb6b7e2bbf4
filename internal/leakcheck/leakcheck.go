package leakcheck

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// DefaultGrace is how long Main waits for goroutines to end after the
// tests: shutdowns that close sockets and wait for peers take a few
// hundred milliseconds; a goroutine that lives past seconds is leaked.
const DefaultGrace = 5 * time.Second

// Option changes what Main ignores or how long it waits.
type Option func(*config)

type config struct {
	grace     time.Duration
	ignoreTop []string
	ignoreBy  []string
}

// Grace sets how long to wait for goroutines to end.
func Grace(d time.Duration) Option { return func(c *config) { c.grace = d } }

// IgnoreTop ignores goroutines whose top frame is the function fn,
// written as in a stack trace (e.g. "os/signal.signal_recv").
func IgnoreTop(fn string) Option { return func(c *config) { c.ignoreTop = append(c.ignoreTop, fn) } }

// IgnoreCreatedBy ignores goroutines created by the function fn,
// written as in a stack trace's "created by" line.
func IgnoreCreatedBy(fn string) Option {
	return func(c *config) { c.ignoreBy = append(c.ignoreBy, fn) }
}

// processWide are goroutines started once per process on first use,
// which no test can stop. Each is named exactly.
var processWide = []Option{
	// signal.Notify starts the signal delivery loop for good.
	IgnoreTop("os/signal.signal_recv"),
}

// Main runs the tests of m and returns the exit code for os.Exit: m's,
// or 1 when the tests passed but left goroutines running after the
// grace period.
func Main(m *testing.M, opts ...Option) int {
	before := ids(snapshot())
	code := m.Run()
	if code != 0 {
		return code // a failing test may leave anything behind
	}
	if leaked := Leaked(before, opts...); leaked != "" {
		fmt.Fprintf(os.Stderr, "leakcheck: goroutines still running after the tests and a grace period:\n\n%s", leaked)
		return 1
	}
	return 0
}

func newConfig(opts []Option) *config {
	c := &config{grace: DefaultGrace}
	for _, o := range slices.Concat(processWide, opts) {
		o(c)
	}
	return c
}

// Baseline returns the ids of the goroutines running now, for Leaked.
func Baseline() map[int]bool { return ids(snapshot()) }

// Leaked waits up to the grace period for every goroutine not in before
// (and not ignored) to end, and returns the stacks of those that did not,
// "" when none.
func Leaked(before map[int]bool, opts ...Option) string {
	c := newConfig(opts)
	deadline := time.Now().Add(c.grace)
	wait := time.Millisecond
	for {
		var left []goroutine
		for _, g := range snapshot() {
			if !before[g.id] && !c.ignored(g) {
				left = append(left, g)
			}
		}
		if len(left) == 0 {
			return ""
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			for _, g := range left {
				b.WriteString(g.stack)
				b.WriteString("\n\n")
			}
			return b.String()
		}
		time.Sleep(wait)
		wait = min(2*wait, 100*time.Millisecond)
	}
}

func (c *config) ignored(g goroutine) bool {
	return slices.Contains(c.ignoreTop, g.top) || slices.Contains(c.ignoreBy, g.createdBy)
}

// goroutine is one entry of a full stack dump.
type goroutine struct {
	id        int
	top       string // function of the first frame
	createdBy string // function named by "created by", "" for main
	stack     string
}

func ids(gs []goroutine) map[int]bool {
	m := make(map[int]bool, len(gs))
	for _, g := range gs {
		m[g.id] = true
	}
	return m
}

// snapshot returns every goroutine but the caller's.
func snapshot() []goroutine {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []goroutine
	for i, block := range bytes.Split(buf, []byte("\n\n")) {
		g, ok := parse(string(block))
		if ok && i > 0 { // the first is the calling goroutine
			out = append(out, g)
		}
	}
	return out
}

// parse reads one goroutine of a stack dump:
//
//	goroutine 7 [chan receive]:
//	pkg.fn(...)
//		/path/file.go:12 +0x1d
//	created by pkg.parent in goroutine 1
//		/path/file.go:30 +0x5a
func parse(block string) (goroutine, bool) {
	lines := strings.Split(strings.TrimSpace(block), "\n")
	rest, ok := strings.CutPrefix(lines[0], "goroutine ")
	if !ok || len(lines) < 2 {
		return goroutine{}, false
	}
	idText, _, _ := strings.Cut(rest, " ")
	id, err := strconv.Atoi(idText)
	if err != nil {
		return goroutine{}, false
	}
	g := goroutine{id: id, top: function(lines[1]), stack: strings.TrimSpace(block)}
	for _, l := range lines[2:] {
		if by, ok := strings.CutPrefix(l, "created by "); ok {
			by, _, _ = strings.Cut(by, " in goroutine ")
			g.createdBy = by
		}
	}
	return g, true
}

// function strips a frame line's arguments: "pkg.(*T).m(0x1, ...)" is
// "pkg.(*T).m".
func function(frame string) string {
	if i := strings.LastIndexByte(frame, '('); i > 0 && strings.HasSuffix(frame, ")") {
		return frame[:i]
	}
	return frame
}
