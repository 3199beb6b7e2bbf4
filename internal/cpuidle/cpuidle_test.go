package cpuidle

import (
	"os"
	"path/filepath"
	"testing"
)

// writeSysfs lays out files as sysfs has them (one value and a newline)
// below a new root.
func writeSysfs(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for rel, v := range files {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// Two CPUs' worth of /proc/cpuinfo, cut down; only the first flags line
// is read.
const (
	vmCPUInfo = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vme de pse tsc msr hypervisor lahf_lm\n\n" +
		"processor\t: 1\nflags\t\t: fpu vme de pse tsc msr hypervisor lahf_lm\n"
	metalCPUInfo = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vme de pse tsc msr hypervisor_no lahf_lm\n"
)

func TestRead(t *testing.T) {
	cases := []struct {
		name   string
		files  map[string]string
		want   Setting
		halts  bool
		String string
	}{
		{"virtual machine halting at once",
			map[string]string{driverFile: "haltpoll", governorFile: "haltpoll", haltPollFile: "0", cpuinfoFile: vmCPUInfo},
			Setting{"haltpoll", "haltpoll", 0, true}, true,
			"cpuidle haltpoll (governor haltpoll) on a virtual machine, guest_halt_poll_ns=0"},
		{"virtual machine polling 200 µs",
			map[string]string{driverFile: "haltpoll", governorFile: "haltpoll", haltPollFile: "200000", cpuinfoFile: vmCPUInfo},
			Setting{"haltpoll", "haltpoll", 200000, true}, false,
			"cpuidle haltpoll (governor haltpoll) on a virtual machine, guest_halt_poll_ns=200000"},
		{"virtual machine without a cpuidle driver",
			map[string]string{driverFile: "none", governorFile: "menu", haltPollFile: "200000", cpuinfoFile: vmCPUInfo},
			Setting{"none", "menu", 200000, true}, true,
			"cpuidle none (governor menu) on a virtual machine, guest_halt_poll_ns=200000 (unused)"},
		{"bare metal",
			map[string]string{driverFile: "intel_idle", governorFile: "menu", cpuinfoFile: metalCPUInfo},
			Setting{"intel_idle", "menu", -1, false}, false,
			"cpuidle intel_idle (governor menu)"},
		{"bare metal without a cpuidle driver",
			map[string]string{driverFile: "none", governorFile: "menu", cpuinfoFile: metalCPUInfo},
			Setting{"none", "menu", -1, false}, false,
			"cpuidle none (governor menu)"},
		{"module loaded, other driver",
			map[string]string{driverFile: "acpi_idle", governorFile: "ladder", haltPollFile: "0"},
			Setting{"acpi_idle", "ladder", 0, false}, false,
			"cpuidle acpi_idle (governor ladder), guest_halt_poll_ns=0 (unused)"},
		{"unreadable value",
			map[string]string{driverFile: "haltpoll", haltPollFile: "many"},
			Setting{"haltpoll", "", -1, false}, false,
			"cpuidle haltpoll"},
		{"no cpuidle", nil, Setting{"", "", -1, false}, false, "cpuidle unknown"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := Read(writeSysfs(t, c.files))
			if s != c.want {
				t.Fatalf("Read = %+v, want %+v", s, c.want)
			}
			if s.HaltsAtOnce() != c.halts {
				t.Errorf("HaltsAtOnce = %v, want %v", s.HaltsAtOnce(), c.halts)
			}
			if s.String() != c.String {
				t.Errorf("String = %q, want %q", s.String(), c.String)
			}
		})
	}
}

// TestReadsThisMachine reads the real sysfs: what the driver file says,
// Read says, and a machine with haltpoll's module gives its value.
func TestReadsThisMachine(t *testing.T) {
	b, err := os.ReadFile("/" + driverFile)
	if err != nil {
		t.Skipf("no cpuidle here: %v", err)
	}
	s := Read("/")
	if want := string(b[:len(b)-1]); s.Driver != want {
		t.Errorf("Driver = %q, want %q", s.Driver, want)
	}
	if _, err := os.Stat("/" + haltPollFile); err == nil && s.HaltPollNs < 0 {
		t.Errorf("haltpoll's module is loaded, HaltPollNs = %d", s.HaltPollNs)
	}
	if info, err := os.ReadFile("/" + cpuinfoFile); err == nil && hasHypervisorFlag(string(info)) != s.Virtual {
		t.Errorf("Virtual = %v, /proc/cpuinfo says otherwise", s.Virtual)
	}
}
