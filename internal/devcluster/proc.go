package devcluster

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Memory reads a process's resident memory now and at its peak (VmRSS
// and VmHWM), in bytes, from /proc. The peak counts since the process
// started, so it includes start-up.
func Memory(pid int) (rss, peak int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("memory of %d: %w", pid, err)
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "VmRSS:":
			rss = kb << 10
		case "VmHWM:":
			peak = kb << 10
		}
	}
	if rss == 0 || peak == 0 {
		return 0, 0, fmt.Errorf("memory of %d: no VmRSS or VmHWM in /proc/%d/status", pid, pid)
	}
	return rss, peak, nil
}

// CPUTime reads the user plus system CPU time a process has used so far
// from /proc.
func CPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("cpu time of %d: %w", pid, err)
	}
	// The command name is in parentheses and may hold spaces, so fields
	// are counted after its closing one: utime and stime are the 14th and
	// 15th fields of the line, the 12th and 13th after the name.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 > len(s) {
		return 0, fmt.Errorf("cpu time of %d: malformed /proc/%d/stat", pid, pid)
	}
	f := strings.Fields(s[i+2:])
	if len(f) < 13 {
		return 0, fmt.Errorf("cpu time of %d: %d fields in /proc/%d/stat", pid, len(f), pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("cpu time of %d: parse /proc/%d/stat: %w", pid, pid, err)
	}
	const ticks = 100 // USER_HZ, fixed at 100 in Linux's user ABI
	return time.Duration(ut+st) * time.Second / ticks, nil
}
