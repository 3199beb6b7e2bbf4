package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// revision is set only by the linker (LDFlags) and never written at run
// time.
var revision string

// RevisionSymbol is the linker's name of the stamped revision, for
// `go build -ldflags "-X <RevisionSymbol>=<rev>"`.
const RevisionSymbol = "github.com/kvcar/kvcar/internal/buildinfo.revision"

// Unknown is the revision of a binary built with neither stamp.
const Unknown = "unknown"

// shortHash is how many hex digits of the toolchain's full commit hash a
// revision keeps, as `git describe --abbrev=12` does.
const shortHash = 12

// LDFlags is the -ldflags value that stamps rev into a binary.
func LDFlags(rev string) string { return "-X " + RevisionSymbol + "=" + rev }

// Revision is the revision this binary was built from.
func Revision() string {
	bi, _ := debug.ReadBuildInfo() // nil when the binary has none
	return resolve(revision, bi)
}

// resolve picks the revision from the link-time stamp, else the build
// info's VCS settings (bi may be nil).
func resolve(stamped string, bi *debug.BuildInfo) string {
	if s := strings.TrimSpace(stamped); s != "" {
		return s
	}
	if bi == nil {
		return Unknown
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value[:min(len(s.Value), shortHash)]
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	switch {
	case rev == "":
		return Unknown
	case dirty:
		return rev + "-dirty"
	default:
		return rev
	}
}

// GoVersion is the Go release that built this binary.
func GoVersion() string { return runtime.Version() }

// VersionLine is what `<program> --version` prints:
// "<program> <revision> <go version> <os>/<arch>".
func VersionLine(program string) string {
	return fmt.Sprintf("%s %s %s %s/%s", program, Revision(), GoVersion(), runtime.GOOS, runtime.GOARCH)
}

// ParseVersion returns the revision of the version line program printed
// (its first line; trailing text ignored).
func ParseVersion(program, out string) (string, error) {
	line, _, _ := strings.Cut(out, "\n")
	f := strings.Fields(line)
	if len(f) < 3 || f[0] != program || !strings.HasPrefix(f[2], "go") {
		return "", fmt.Errorf("not a version line of %s: %q", program, line[:min(len(line), 200)])
	}
	return f[1], nil
}
