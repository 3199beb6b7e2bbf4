package sysmon

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// childEnv marks this test binary, run again, as the child of
// TestSettingQuietsTheMonitor.
const childEnv = "KVCAR_SYSMON_TEST_CHILD"

const childMessages = 2000

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		if err := bursts(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// bursts runs kvcar's pattern at its simplest: idle with no timer due,
// until a message from another process wakes it for a short burst that
// makes a system call. It prints its listening address, serves one
// connection until it closes, then prints the context switches of all
// its threads.
func bursts() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	fmt.Println(ln.Addr())
	c, err := ln.Accept()
	if err != nil {
		return err
	}
	defer c.Close()
	f, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	b := make([]byte, 1)
	for {
		if _, err := c.Read(b); err == io.EOF {
			break
		} else if err != nil {
			return err
		}
		if _, err := f.Write(b); err != nil {
			return err
		}
	}
	sw, err := switches()
	if err != nil {
		return err
	}
	fmt.Println(sw)
	return nil
}

// switches sums the voluntary and involuntary context switches of every
// thread of this process.
func switches() (int, error) {
	tasks, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil {
		return 0, err
	}
	sum := 0
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			return 0, err
		}
		for line := range strings.Lines(string(b)) {
			k, v, ok := strings.Cut(line, ":")
			if !ok || (k != "voluntary_ctxt_switches" && k != "nonvoluntary_ctxt_switches") {
				continue
			}
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				return 0, fmt.Errorf("%s: %q: %w", p, line, err)
			}
			sum += n
		}
	}
	return sum, nil
}

// childSwitches runs bursts in a child whose GODEBUG is godebug, sends
// it childMessages one-byte messages 500 µs apart, and returns the
// context switches it counted.
func childSwitches(t *testing.T, godebug string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", "GODEBUG="+godebug)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	lines := bufio.NewScanner(out)
	if !lines.Scan() {
		t.Fatalf("child with GODEBUG=%q printed no address: %v", godebug, lines.Err())
	}
	c, err := net.Dial("tcp", lines.Text())
	if err != nil {
		t.Fatal(err)
	}
	for range childMessages {
		time.Sleep(500 * time.Microsecond)
		if _, err := c.Write([]byte{1}); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	if !lines.Scan() {
		t.Fatalf("child with GODEBUG=%q printed no count: %v", godebug, lines.Err())
	}
	n, err := strconv.Atoi(lines.Text())
	if err != nil {
		t.Fatalf("child with GODEBUG=%q printed %q", godebug, lines.Text())
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child with GODEBUG=%q: %v", godebug, err)
	}
	return n
}

// The package rests on a behaviour of the Go runtime that its
// documentation does not promise: with schedtrace set, sysmon stops
// deep-sleeping, so that a process going idle and waking up again does
// not wake sysmon as well. A Go release that changed this would make
// Setting useless; this test says so.
func TestSettingQuietsTheMonitor(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two child processes of a second or so")
	}
	def := childSwitches(t, "")
	set := childSwitches(t, Setting)
	t.Logf("%d messages: %d context switches by default, %d with GODEBUG=%s", childMessages, def, set, Setting)
	// Each message costs the woken thread a switch either way; by
	// default sysmon adds about two more: woken by the burst's system
	// call, then once more polling before it deep-sleeps again.
	if set > def*3/4 {
		t.Fatalf("GODEBUG=%s saved too few context switches: %d by default, %d with it", Setting, def, set)
	}
}
