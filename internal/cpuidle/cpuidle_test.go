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

func TestRead(t *testing.T) {
	cases := []struct {
		name   string
		files  map[string]string
		want   Setting
		halts  bool
		String string
	}{
		{"virtual machine halting at once",
			map[string]string{driverFile: "haltpoll", governorFile: "haltpoll", haltPollFile: "0"},
			Setting{"haltpoll", "haltpoll", 0}, true,
			"cpuidle haltpoll (governor haltpoll), guest_halt_poll_ns=0"},
		{"virtual machine polling 200 µs",
			map[string]string{driverFile: "haltpoll", governorFile: "haltpoll", haltPollFile: "200000"},
			Setting{"haltpoll", "haltpoll", 200000}, false,
			"cpuidle haltpoll (governor haltpoll), guest_halt_poll_ns=200000"},
		{"bare metal",
			map[string]string{driverFile: "intel_idle", governorFile: "menu"},
			Setting{"intel_idle", "menu", -1}, false,
			"cpuidle intel_idle (governor menu)"},
		{"module loaded, other driver",
			map[string]string{driverFile: "acpi_idle", governorFile: "ladder", haltPollFile: "0"},
			Setting{"acpi_idle", "ladder", 0}, false,
			"cpuidle acpi_idle (governor ladder), guest_halt_poll_ns=0 (unused)"},
		{"module loaded, no driver",
			map[string]string{driverFile: "none", governorFile: "menu", haltPollFile: "200000"},
			Setting{"none", "menu", 200000}, false,
			"cpuidle none (governor menu), guest_halt_poll_ns=200000 (unused)"},
		{"unreadable value",
			map[string]string{driverFile: "haltpoll", haltPollFile: "many"},
			Setting{"haltpoll", "", -1}, false,
			"cpuidle haltpoll"},
		{"no cpuidle", nil, Setting{"", "", -1}, false, "cpuidle unknown"},
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
}
