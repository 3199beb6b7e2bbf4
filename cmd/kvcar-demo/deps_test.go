package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunInstallsOnlyWhatRunningNeeds covers issue 10 item 10: make run
// installs libzmq only, and make test the test tools as well (chromium
// is hundreds of MB and only the status page's screenshot test uses it).
// scripts/deps.sh runs with a PATH on which libzmq is found and chromium
// is not, in its dry-run mode.
func TestRunInstallsOnlyWhatRunningNeeds(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("bash not installed")
	}
	stubs := t.TempDir()
	if err := os.WriteFile(filepath.Join(stubs, "pkg-config"), []byte("#!"+bash+"\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	deps := func(args ...string) (string, error) {
		cmd := exec.Command(bash, append([]string{"../../scripts/deps.sh"}, args...)...)
		cmd.Env = []string{"PATH=" + stubs, "KVCAR_DEPS_DRY_RUN=1"}
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if out, err := deps("run"); err != nil || out != "nothing to install" {
		t.Errorf("deps.sh run with libzmq present: %q %v, want nothing to install", out, err)
	}
	if out, err := deps("test"); err != nil || !strings.HasPrefix(out, "would install:") || !strings.Contains(out, "chromium") {
		t.Errorf("deps.sh test without chromium: %q %v, want chromium installed", out, err)
	}
	if out, err := deps(); err == nil || !strings.Contains(out, "usage") {
		t.Errorf("deps.sh without an argument: %q %v, want its usage", out, err)
	}

	makeBin, err := exec.LookPath("make")
	if err != nil {
		t.Skip("make not installed")
	}
	for target, want := range map[string]string{"run": "deps.sh run", "build": "deps.sh run", "test": "deps.sh test"} {
		cmd := exec.Command(makeBin, "-n", target)
		cmd.Dir = "../.."
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("make -n %s: %v\n%s", target, err, out)
		}
		if !strings.Contains(string(out), want) || (target != "test" && strings.Contains(string(out), "deps.sh test")) {
			t.Errorf("make %s runs:\n%s\nwant %s and no test tools", target, out, want)
		}
	}
}
