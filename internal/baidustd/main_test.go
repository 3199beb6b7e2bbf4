package baidustd

import (
	"os"
	"testing"

	"github.com/kvcar/kvcar/internal/leakcheck"
)

// TestMain fails the package's tests when they leave goroutines running:
// connections' readers and workers must all stop with their server.
func TestMain(m *testing.M) { os.Exit(leakcheck.Main(m)) }
