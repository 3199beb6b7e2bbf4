package zapslog

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// TestLevelsFieldsAndDrop checks that entries below min are dropped, that
// fields (With and per entry) become slog attributes in key order, and
// that drop discards what it matches.
func TestLevelsFieldsAndDrop(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	drop := func(msg string, fields map[string]any) bool { return fields["noise"] == true }
	z := New(log, zapcore.WarnLevel, "etcd: ", drop).With(zap.String("member", "m1"))

	z.Info("not shown")
	z.Warn("slow apply", zap.Duration("took", 3e9), zap.Error(errors.New("disk")))
	z.Error("routine", zap.Bool("noise", true))
	out := buf.String()
	if strings.Contains(out, "not shown") || strings.Contains(out, "routine") {
		t.Fatalf("filtered entries logged:\n%s", out)
	}
	for _, want := range []string{"level=WARN", `msg="etcd: slow apply"`, "member=m1", "took=3s", "error=disk"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in %q", want, out)
		}
	}
	if strings.Index(out, "error=") > strings.Index(out, "took=") {
		t.Errorf("fields not in key order: %q", out)
	}
}
