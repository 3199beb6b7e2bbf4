package buildinfo

import (
	"os"
	"runtime/debug"
	"strings"
	"testing"
)

func settings(kv ...string) *debug.BuildInfo {
	bi := &debug.BuildInfo{}
	for i := 0; i < len(kv); i += 2 {
		bi.Settings = append(bi.Settings, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
	}
	return bi
}

// The link-time stamp wins; without it the toolchain's VCS stamp, cut to
// 12 digits and marked dirty after a modified tree; without either,
// Unknown, never an empty or made-up revision.
func TestResolve(t *testing.T) {
	const full = "1c6bfd7a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e"
	for _, tc := range []struct {
		name    string
		stamped string
		bi      *debug.BuildInfo
		want    string
	}{
		{"stamp over vcs", "v1.2-3-gabc", settings("vcs.revision", full, "vcs.modified", "true"), "v1.2-3-gabc"},
		{"stamp without build info", "1c6bfd7a0b1c-dirty", nil, "1c6bfd7a0b1c-dirty"},
		{"stamp trimmed", " 1c6bfd7a0b1c\n", nil, "1c6bfd7a0b1c"},
		{"vcs clean", "", settings("vcs", "git", "vcs.revision", full, "vcs.modified", "false"), "1c6bfd7a0b1c"},
		{"vcs modified", "", settings("vcs.modified", "true", "vcs.revision", full), "1c6bfd7a0b1c-dirty"},
		{"vcs short hash", "", settings("vcs.revision", "abc"), "abc"},
		{"modified without a revision", "", settings("vcs.modified", "true"), Unknown},
		{"no vcs settings", "", settings("-compiler", "gc", "GOARCH", "amd64"), Unknown},
		{"no build info", "", nil, Unknown},
		{"blank stamp", "  ", nil, Unknown},
	} {
		if got := resolve(tc.stamped, tc.bi); got != tc.want {
			t.Errorf("%s: revision %q, want %q", tc.name, got, tc.want)
		}
	}
}

// A test binary is stamped neither by the linker nor by the toolchain's
// VCS stamp, so Revision takes the last fallback.
func TestRevisionOfUnstampedBinary(t *testing.T) {
	if revision != "" {
		t.Skipf("this test binary was stamped %q at link time", revision)
	}
	bi, _ := debug.ReadBuildInfo()
	if got, want := Revision(), resolve("", bi); got != want {
		t.Fatalf("Revision() = %q, resolve of the build info %q", got, want)
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			t.Skipf("this test binary carries a VCS stamp %s", s.Value)
		}
	}
	if got := Revision(); got != Unknown {
		t.Fatalf("Revision() = %q with nothing stamped, want %q", got, Unknown)
	}
}

// What a binary prints for --version is what a program reading it parses
// back; other output (an older binary's complaint about the flag, another
// program's line) is refused, naming the line.
func TestVersionLineRoundTrip(t *testing.T) {
	line := VersionLine("kvcar")
	if !strings.HasPrefix(line, "kvcar "+Revision()+" "+GoVersion()+" ") {
		t.Fatalf("version line %q", line)
	}
	rev, err := ParseVersion("kvcar", line+"\n")
	if err != nil || rev != Revision() {
		t.Fatalf("ParseVersion(%q) = %q, %v; want %q", line, rev, err, Revision())
	}
	if rev, err := ParseVersion("kvcar", "kvcar 0123456789ab-dirty go1.26.8 linux/amd64\nmore"); err != nil || rev != "0123456789ab-dirty" {
		t.Fatalf("ParseVersion of a stamped line = %q, %v", rev, err)
	}
	for _, out := range []string{
		"",
		"flag provided but not defined: -version\nUsage of kvcar:\n",
		"kvcar-load 0123456789ab go1.26.8 linux/amd64",
		"kvcar 0123456789ab",
		"kvcar: unexpected arguments: [\"x\"]",
		strings.Repeat("x", 1<<20),
	} {
		rev, err := ParseVersion("kvcar", out)
		if err == nil {
			t.Errorf("ParseVersion(%.40q) = %q, want an error", out, rev)
			continue
		}
		if !strings.Contains(err.Error(), "not a version line of kvcar") || len(err.Error()) > 300 {
			t.Errorf("ParseVersion(%.40q): error %.400q", out, err)
		}
	}
}

// make build stamps every program through RevisionSymbol: a renamed
// variable or package would silently leave the builds unstamped.
func TestMakefileStampsTheBuild(t *testing.T) {
	b, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	mk := string(b)
	_, rule, ok := strings.Cut(mk, "\nbuild:")
	if !ok {
		t.Fatal("Makefile has no build target")
	}
	rule, _, _ = strings.Cut(rule, "\n\n")
	if !strings.Contains(rule, "-ldflags") || !strings.Contains(rule, "$(GO_LDFLAGS)") {
		t.Fatalf("make build does not pass $(GO_LDFLAGS):%s", rule)
	}
	if !strings.Contains(mk, "-X "+RevisionSymbol+"=") {
		t.Fatalf("the Makefile's GO_LDFLAGS do not stamp %s", RevisionSymbol)
	}
}
