package testlog

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
)

// Buffer is an io.Writer safe for concurrent writers and readers; the
// zero value is ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Count returns how many times sub occurs in what was written so far.
func (l *Buffer) Count(sub string) int {
	return strings.Count(l.String(), sub)
}

// Logger returns a text logger writing records at level or above to l.
func (l *Buffer) Logger(level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: level}))
}
