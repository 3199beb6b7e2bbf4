package devcluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvcar/kvcar/internal/buildinfo"
)

func TestRevisionsName(t *testing.T) {
	for _, tc := range []struct {
		r    Revisions
		want string
	}{
		{Revisions{KVCar: "0123456789ab", Driver: "0123456789ab"}, "commit 0123456789ab"},
		{Revisions{KVCar: "0123456789ab", Driver: "ba9876543210-dirty"}, "kvcar commit 0123456789ab (driver commit ba9876543210-dirty)"},
		{Revisions{KVCar: buildinfo.Unknown, Driver: "0123456789ab"}, "kvcar commit unknown (driver commit 0123456789ab)"},
	} {
		if got := tc.r.String(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.r, got, tc.want)
		}
	}
}

// GitRevision names the checked-out commit as make build stamps it, and
// an unstamped program (this test binary) falls back to it; outside a
// repository it says git could not tell.
func TestGitRevisionNamesHead(t *testing.T) {
	head, err := exec.CommandContext(t.Context(), "git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("no git repository here: %v", err)
	}
	full := strings.TrimSpace(string(head))
	rev, err := GitRevision(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	commit := strings.TrimSuffix(rev, "-dirty")
	if i := strings.LastIndex(commit, "-g"); i >= 0 { // past a tag
		commit = commit[i+2:]
	}
	if len(commit) < 12 || !strings.HasPrefix(full, commit) {
		t.Fatalf("GitRevision = %q, HEAD is %s", rev, full)
	}
	if got := Revision(); got != rev {
		t.Fatalf("Revision() of an unstamped binary = %q, want git's %q", got, rev)
	}
	if rev, err := GitRevision(t.Context(), t.TempDir()); err == nil || !strings.Contains(err.Error(), "git describe") {
		t.Fatalf("GitRevision outside a repository = %q, %v", rev, err)
	}
}

// script writes an executable shell script standing in for a kvcar
// binary of another build.
func script(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kvcar")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// A binary older than --version is told apart from one that fails: the
// first has an unknown revision, the second is an error naming it.
func TestKVCarRevisionOfOtherBinaries(t *testing.T) {
	older := script(t, `echo "flag provided but not defined: -version" >&2; echo "Usage of kvcar:" >&2; exit 1`)
	if rev, err := KVCarRevision(t.Context(), older); err != nil || rev != buildinfo.Unknown {
		t.Fatalf("binary without --version: %q, %v; want %q", rev, err, buildinfo.Unknown)
	}
	stamped := script(t, `echo "kvcar 0123456789ab-dirty go1.26.8 linux/amd64"`)
	if rev, err := KVCarRevision(t.Context(), stamped); err != nil || rev != "0123456789ab-dirty" {
		t.Fatalf("stamped binary: %q, %v", rev, err)
	}
	for name, bin := range map[string]string{
		"fails":        script(t, `echo "kvcar: cannot start" >&2; exit 1`),
		"prints other": script(t, `echo "hello"`),
		"missing":      filepath.Join(t.TempDir(), "kvcar"),
	} {
		rev, err := KVCarRevision(t.Context(), bin)
		if err == nil || !strings.Contains(err.Error(), bin) {
			t.Errorf("%s: %q, %v; want an error naming the binary", name, rev, err)
		}
	}
}
