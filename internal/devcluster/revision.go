package devcluster

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/kvcar/kvcar/internal/buildinfo"
)

// Revision is the commit the running program was built from: its build's
// stamp (internal/buildinfo), else, for a program run with `go run` or
// built without the stamp, what git says of the working directory.
func Revision() string {
	if rev := buildinfo.Revision(); rev != buildinfo.Unknown {
		return rev
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rev, err := GitRevision(ctx, "")
	if err != nil {
		return buildinfo.Unknown
	}
	return rev
}

// GitRevision is the commit checked out in dir (the working directory
// when empty), "-dirty" when tracked files have changes, as `make build`
// stamps it.
func GitRevision(ctx context.Context, dir string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "git", "describe", "--always", "--dirty", "--abbrev=12")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("git describe: %w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return "", fmt.Errorf("git describe: %w", err)
	}
	rev := strings.TrimSpace(string(out))
	if rev == "" {
		return "", errors.New("git describe printed nothing")
	}
	return rev, nil
}

// KVCarRevision asks the kvcar binary for the revision it was built from
// (`kvcar --version`). A binary older than the flag says it does not know
// it; its revision is then buildinfo.Unknown.
func KVCarRevision(ctx context.Context, binary string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary, "--version").CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "flag provided but not defined: -version") {
			return buildinfo.Unknown, nil
		}
		return "", fmt.Errorf("%s --version: %w: %s", binary, err, strings.TrimSpace(string(out[:min(len(out), 1024)])))
	}
	rev, err := buildinfo.ParseVersion("kvcar", string(out))
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", binary, err)
	}
	return rev, nil
}

// Revisions are the commits behind a benchmark's numbers: the kvcar
// binary measured and the program that drove it, which differ when one
// was rebuilt and the other not.
type Revisions struct {
	KVCar, Driver string
}

// String names the commit, or both commits when they differ, for a
// report's "Generated … from <String> …" line.
func (r Revisions) String() string {
	if r.KVCar == r.Driver {
		return "commit " + r.KVCar
	}
	return fmt.Sprintf("kvcar commit %s (driver commit %s)", r.KVCar, r.Driver)
}
