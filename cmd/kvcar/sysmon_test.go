package main

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvcar/kvcar/internal/cmalloc"
	"github.com/kvcar/kvcar/internal/cpuidle"
	"github.com/kvcar/kvcar/internal/devcluster"
	"github.com/kvcar/kvcar/internal/sysmon"
)

// kvcar restarts itself, same process, under sysmon.Setting unless the
// operator's GODEBUG names schedtrace, and its start-up line says which
// pace the runtime's monitor keeps. The process keeps its name, so that
// ps and pgrep still find kvcar. The line also says whether kvcar set
// the C allocator's thresholds or left the operator's.
func TestRestartsUnderSysmonSetting(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kvcar and runs it as a process")
	}
	bin, err := devcluster.BuildKVCar(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	etcd := startEtcd(t)
	for _, c := range []struct {
		name    string
		godebug string // kvcar's GODEBUG when started
		want    string // its GODEBUG once running
		state   sysmon.State
		malloc  string // an operator's malloc setting, if any
		cmem    cmalloc.State
	}{
		{"unset", "", "GODEBUG=" + sysmon.Setting, sysmon.Polling, "", cmalloc.Kept},
		{"other settings", "GODEBUG=gctrace=0", "GODEBUG=gctrace=0," + sysmon.Setting, sysmon.Polling, "", cmalloc.Kept},
		{"opted out", "GODEBUG=schedtrace=0", "GODEBUG=schedtrace=0", sysmon.OptedOut, "MALLOC_TRIM_THRESHOLD_=131072", cmalloc.OperatorSet},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := devcluster.KVCarOptions{Binary: bin, Etcd: etcd.Endpoints(), Args: []string{"--host=127.0.0.1"}}
			// Unset, it would inherit this test's environment.
			o.Env = []string{"GODEBUG="}
			if c.godebug != "" {
				o.Env = []string{c.godebug}
			}
			if c.malloc != "" {
				o.Env = append(o.Env, c.malloc)
			}
			kv, logPath := startLoggedKVCar(t, o)
			listening := listeningLine(t, kv, logPath)
			for _, want := range []string{fmt.Sprintf(" sysmon=%s ", c.state), fmt.Sprintf(" c_malloc=%s ", c.cmem)} {
				if !strings.Contains(strings.TrimSpace(listening)+" ", want) {
					t.Errorf("start-up line %q lacks%s", listening, want)
				}
			}
			// The same process, now running with the setting.
			environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", kv.Pid()))
			if err != nil {
				t.Fatal(err)
			}
			var godebug []string
			for kv := range bytes.SplitSeq(environ, []byte{0}) {
				if bytes.HasPrefix(kv, []byte("GODEBUG=")) {
					godebug = append(godebug, string(kv))
				}
			}
			if len(godebug) != 1 || godebug[0] != c.want {
				t.Errorf("kvcar runs with %q, want [%q]", godebug, c.want)
			}
			comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", kv.Pid()))
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimSpace(string(comm)); got != filepath.Base(bin) {
				t.Errorf("process is named %q, want %q", got, filepath.Base(bin))
			}
			logs, _ := os.ReadFile(logPath)
			if deep := strings.Contains(string(logs), "deep-sleeps between bursts"); deep != (c.state != sysmon.Polling) {
				t.Errorf("kvcar logged the monitor's default pace: %v, want %v", deep, c.state != sysmon.Polling)
			}
		})
	}
}

// kvcar says at start when the machine's idle vCPUs halt without polling
// (cpuidle-haltpoll with guest_halt_poll_ns=0, or no cpuidle driver on a
// virtual machine), and says nothing otherwise.
func TestIdleNotice(t *testing.T) {
	for _, c := range []struct {
		s    cpuidle.Setting
		want bool
	}{
		{cpuidle.Setting{Driver: "haltpoll", Governor: "haltpoll", HaltPollNs: 0}, true},
		{cpuidle.Setting{Driver: "none", Governor: "menu", HaltPollNs: 200000, Virtual: true}, true},
		{cpuidle.Setting{Driver: "none", Governor: "menu", HaltPollNs: -1}, false},
		{cpuidle.Setting{Driver: "haltpoll", Governor: "haltpoll", HaltPollNs: 200000}, false},
		{cpuidle.Setting{Driver: "intel_idle", Governor: "menu", HaltPollNs: -1}, false},
		{cpuidle.Setting{HaltPollNs: -1}, false},
	} {
		var out bytes.Buffer
		idleNotice(slog.New(slog.NewTextHandler(&out, nil)), c.s)
		got := out.String()
		if said := strings.Contains(got, "idle CPUs halt at once"); said != c.want {
			t.Errorf("%v: notice %q, want one: %v", c.s, got, c.want)
		}
		if c.want && !strings.Contains(got, "cpuidle "+c.s.Driver) {
			t.Errorf("%v: notice %q does not name the setting", c.s, got)
		}
	}
}
