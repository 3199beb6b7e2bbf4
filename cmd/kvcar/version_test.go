package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/buildinfo"
	"github.com/kvcar/kvcar/internal/devcluster"
)

// versionOf runs bin --version and returns what it printed on stdout,
// failing the test unless it exits 0 with nothing on stderr.
func versionOf(t *testing.T, bin string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "--version")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s --version: %v\n%s", bin, err, stderr.String())
	}
	if stderr.Len() > 0 {
		t.Errorf("%s --version wrote to stderr: %q", bin, stderr.String())
	}
	return stdout.String()
}

// A binary built with the revision stamped, as make build and devcluster
// stamp it, prints it for --version and exits at once, names it on
// /metrics as kvcar_build_info, and logs it when it starts listening.
func TestStampedBinaryReportsItsRevision(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kvcar and runs it as a process")
	}
	const rev = "0123456789ab-test"
	bin, err := devcluster.BuildKVCarRevision(t.Context(), t.TempDir(), rev)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("kvcar %s %s %s/%s\n", rev, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if got := versionOf(t, bin); got != want {
		t.Fatalf("--version printed %q, want %q", got, want)
	}
	if got, err := devcluster.KVCarRevision(t.Context(), bin); err != nil || got != rev {
		t.Fatalf("devcluster.KVCarRevision = %q, %v; want %q", got, err, rev)
	}

	etcd := startEtcd(t)
	kv, logPath := startLoggedKVCar(t, devcluster.KVCarOptions{Binary: bin, Etcd: etcd.Endpoints(),
		Args: []string{"--host=127.0.0.1"}})

	metric := fmt.Sprintf(`kvcar_build_info{goversion=%q,revision=%q} 1`, runtime.Version(), rev)
	var scraped string
	waitUntil(t, "kvcar serves /metrics", 20*time.Second, func() bool {
		if err := kv.Exited(); err != nil {
			t.Fatal(err)
		}
		resp, err := http.Get(kv.InternalURL() + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
		scraped = string(b)
		return err == nil && resp.StatusCode == http.StatusOK
	})
	if !strings.Contains(scraped, "\n"+metric+"\n") || !strings.Contains(scraped, "# TYPE kvcar_build_info gauge\n") {
		t.Fatalf("/metrics lacks %s:\n%s", metric, grepLines(scraped, "kvcar_build_info"))
	}
	// The line is written once the servers run, maybe after /metrics
	// answered.
	listening := listeningLine(t, kv, logPath)
	if !strings.Contains(listening, " revision="+rev+" ") || !strings.Contains(listening, " go="+runtime.Version()) {
		t.Fatalf("start-up log line %q does not name revision %s and %s", listening, rev, runtime.Version())
	}
}

// Without a stamp (and without the toolchain's VCS stamp, as on a machine
// building with -buildvcs=false) kvcar says its revision is unknown
// rather than inventing one.
func TestUnstampedBinaryReportsUnknown(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kvcar")
	}
	bin, err := devcluster.BuildKVCarRevision(t.Context(), t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("kvcar %s %s %s/%s\n", buildinfo.Unknown, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if got := versionOf(t, bin); got != want {
		t.Fatalf("--version printed %q, want %q", got, want)
	}
	if got, err := devcluster.KVCarRevision(t.Context(), bin); err != nil || got != buildinfo.Unknown {
		t.Fatalf("devcluster.KVCarRevision = %q, %v; want %q", got, err, buildinfo.Unknown)
	}
}

// run given --version writes the version line and returns without
// opening a listener, whatever other flags say.
func TestRunVersionStartsNothing(t *testing.T) {
	var out strings.Builder
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := run(ctx, []string{"--version", "--http_server_port=1", "--etcd_addr=127.0.0.1:1"}, &out, nil); err != nil {
		t.Fatalf("run --version: %v", err)
	}
	if got, want := out.String(), buildinfo.VersionLine("kvcar")+"\n"; got != want {
		t.Fatalf("run --version wrote %q, want %q", got, want)
	}
	if _, err := parseFlags([]string{"--version=maybe"}, io.Discard); err == nil {
		t.Fatal("--version=maybe accepted")
	}
}

// startLoggedKVCar starts kvcar as o says, its output in a file whose
// path it returns; the test's cleanup stops it and, if the test failed,
// logs that output.
func startLoggedKVCar(t *testing.T, o devcluster.KVCarOptions) (*devcluster.KVCar, string) {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "kvcar.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logFile.Close() })
	o.Stdout, o.Stderr = logFile, logFile
	kv, err := devcluster.StartKVCar(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := kv.Stop(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("kvcar output:\n%s", b)
		}
	})
	return kv, logPath
}

// listeningLine waits for kvcar's "kvcar listening" line in its log and
// returns it.
func listeningLine(t *testing.T, kv *devcluster.KVCar, logPath string) string {
	t.Helper()
	var line string
	waitUntil(t, "kvcar logs that it listens", 20*time.Second, func() bool {
		if err := kv.Exited(); err != nil {
			t.Fatal(err)
		}
		logs, err := os.ReadFile(logPath)
		if err != nil {
			t.Fatal(err)
		}
		line = grepLines(string(logs), `msg="kvcar listening"`)
		return strings.HasSuffix(string(logs), "\n") && line != ""
	})
	return line
}

// grepLines returns the lines of s containing sub.
func grepLines(s, sub string) string {
	var out []string
	for line := range strings.Lines(s) {
		if strings.Contains(line, sub) {
			out = append(out, strings.TrimRight(line, "\n"))
		}
	}
	return strings.Join(out, "\n")
}
