package etcdembed

import (
	"os"
	"testing"

	"github.com/kvcar/kvcar/internal/leakcheck"
)

// TestMain fails the package's tests when they leave goroutines running
// (issue 10 item 14).
func TestMain(m *testing.M) { os.Exit(leakcheck.Main(m)) }
