package testlog

import (
	"log/slog"
	"sync"
	"testing"
)

func TestBufferConcurrentWritersAndLevel(t *testing.T) {
	var b Buffer
	log := b.Logger(slog.LevelWarn)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				log.Warn("kept")
				log.Info("dropped")
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if n := b.Count("msg=kept"); n != 800 {
		t.Errorf("Count(kept) = %d, want 800", n)
	}
	if n := b.Count("dropped"); n != 0 {
		t.Errorf("records below the level were written: %d", n)
	}
}
