package cmalloc

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// childEnv, when set, makes the test binary the child of
// TestKeptMemoryIsNotFaultedAgain: "keep" applies Keep first, "default"
// does not; it then prints the minor page faults of its churn.
const childEnv = "KVCAR_CMALLOC_CHILD"

// Four buffers of 70 KB a round, about what a 16,384-id prefill's KV
// events take a message, for 200 rounds.
const (
	churnSize   = 70 << 10
	churnN      = 4
	churnRounds = 200
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(child(mode))
	}
	os.Exit(m.Run())
}

func child(mode string) int {
	if mode == "keep" {
		if s := Keep(func(string) (string, bool) { return "", false }); s != Kept {
			fmt.Println("keep:", s)
			return 1
		}
	}
	// The first round finds the heap empty whatever the settings.
	if err := churn(churnSize, churnN, 1); err != nil {
		fmt.Println(err)
		return 1
	}
	before := minorFaults()
	if err := churn(churnSize, churnN, churnRounds); err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Println(minorFaults() - before)
	return 0
}

func minorFaults() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return ru.Minflt
}

// With glibc's defaults, memory freed at the top of a heap goes back to
// the kernel past 128 KB and every round faults its pages in again; with
// Keep's settings a round reuses the last one's memory. Each way runs in
// a child process of its own, since settings cannot be taken back.
func TestKeptMemoryIsNotFaultedAgain(t *testing.T) {
	if Keep(os.LookupEnv) == Unsupported {
		t.Skip("the C library takes no malloc thresholds")
	}
	faults := map[string]int64{}
	for _, mode := range []string{"default", "keep"} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		// glibc's defaults, whatever this process runs under: an
		// operator's variable, even empty, sets a threshold.
		cmd.Env = []string{childEnv + "=" + mode}
		for _, kv := range os.Environ() {
			if name, _, _ := strings.Cut(kv, "="); !slices.Contains([]string{tunablesEnv, mmapEnv, trimEnv, childEnv}, name) {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", mode, err, out)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
		if err != nil {
			t.Fatalf("%s: %q", mode, out)
		}
		faults[mode] = n
	}
	t.Logf("minor faults over %d rounds of %d × %d KB: %d by default, %d kept", churnRounds, churnN, churnSize>>10, faults["default"], faults["keep"])
	// A round that gives back the top of the heap faults in tens of
	// pages; one that reuses it, none.
	if faults["default"] < churnRounds*10 {
		t.Errorf("by default the churn faulted %d pages in %d rounds: the test no longer shows glibc trimming", faults["default"], churnRounds)
	}
	if faults["keep"] > churnRounds/10 {
		t.Errorf("with Keep the churn faulted %d pages in %d rounds, want almost none", faults["keep"], churnRounds)
	}
}

// An operator's own thresholds, in GLIBC_TUNABLES or glibc's older
// variables, are left to rule; other tunables are not.
func TestOperatorSettingsWin(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want bool
	}{
		{nil, false},
		{map[string]string{"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, false},
		{map[string]string{"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=65536"}, true},
		{map[string]string{"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0:glibc.malloc.mmap_threshold=1048576"}, true},
		{map[string]string{"GLIBC_TUNABLES": "glibc.malloc.trim_threshold_x=1"}, false},
		{map[string]string{"MALLOC_TRIM_THRESHOLD_": "131072"}, true},
		{map[string]string{"MALLOC_MMAP_THRESHOLD_": "131072"}, true},
		{map[string]string{"MALLOC_TRIM_THRESHOLD_": ""}, true},
		{map[string]string{"MALLOC_ARENA_MAX": "2"}, false},
	} {
		lookup := func(k string) (string, bool) { v, ok := c.env[k]; return v, ok }
		if got := operatorSet(lookup); got != c.want {
			t.Errorf("operatorSet(%v) = %v, want %v", c.env, got, c.want)
		}
		if c.want && Keep(lookup) != OperatorSet {
			t.Errorf("Keep(%v) = %v, want %v", c.env, Keep(lookup), OperatorSet)
		}
	}
}
