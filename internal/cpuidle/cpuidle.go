package cpuidle

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Setting is how the machine's idle CPUs wait; empty strings and a
// negative HaltPollNs mean the machine does not say.
type Setting struct {
	// Driver and Governor are the cpuidle driver and governor in use
	// (haltpoll on a virtual machine that polls before it halts).
	Driver, Governor string
	// HaltPollNs is haltpoll's guest_halt_poll_ns: how long an idle vCPU
	// polls before it halts; 0 halts at once. -1 when there is no
	// haltpoll module.
	HaltPollNs int64
	// Virtual: the CPUs say they run under a hypervisor (the
	// "hypervisor" flag of /proc/cpuinfo).
	Virtual bool
}

// Paths of the files Read reads, below the root it is given.
const (
	driverFile   = "sys/devices/system/cpu/cpuidle/current_driver"
	governorFile = "sys/devices/system/cpu/cpuidle/current_governor"
	haltPollFile = "sys/module/haltpoll/parameters/guest_halt_poll_ns"
	cpuinfoFile  = "proc/cpuinfo"
)

// Read reads the setting from the sysfs under root ("/" for this
// machine's). A file that is missing or unreadable leaves its field
// unknown: a machine without cpuidle, or not Linux, has nothing to say.
func Read(root string) Setting {
	s := Setting{
		Driver:     readValue(root, driverFile),
		Governor:   readValue(root, governorFile),
		HaltPollNs: -1,
	}
	if v := readValue(root, haltPollFile); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
			s.HaltPollNs = n
		}
	}
	s.Virtual = hasHypervisorFlag(readValue(root, cpuinfoFile))
	return s
}

// hasHypervisorFlag reports whether the first CPU's flags in cpuinfo
// include "hypervisor".
func hasHypervisorFlag(cpuinfo string) bool {
	for line := range strings.Lines(cpuinfo) {
		name, flags, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(name) == "flags" {
			return slices.Contains(strings.Fields(flags), "hypervisor")
		}
	}
	return false
}

func readValue(root, rel string) string {
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// HaltsAtOnce reports whether idle vCPUs halt without polling first: the
// haltpoll driver with guest_halt_poll_ns at 0, or a virtual machine with
// no cpuidle driver, whose idle loop halts (haltpoll's driver registers
// only when the hypervisor hints it or the kernel is booted with
// cpuidle_haltpoll.force=1).
func (s Setting) HaltsAtOnce() bool {
	return s.Driver == "haltpoll" && s.HaltPollNs == 0 || s.Driver == "none" && s.Virtual
}

// String describes the setting for a benchmark's report, e.g.
// "cpuidle haltpoll (governor haltpoll), guest_halt_poll_ns=0".
func (s Setting) String() string {
	if s.Driver == "" {
		return "cpuidle unknown"
	}
	out := "cpuidle " + s.Driver
	if s.Governor != "" {
		out += " (governor " + s.Governor + ")"
	}
	if s.Virtual {
		out += " on a virtual machine"
	}
	if s.HaltPollNs >= 0 {
		out += fmt.Sprintf(", guest_halt_poll_ns=%d", s.HaltPollNs)
		if s.Driver != "haltpoll" {
			// The module's parameter acts only through its driver.
			out += " (unused)"
		}
	}
	return out
}
