package instance

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/kvcar/kvcar/internal/config"
	"github.com/kvcar/kvcar/internal/testlog"
)

// Issue 10 item 5: only business addresses host:port are instance names.
func TestCheckName(t *testing.T) {
	good := []string{
		"127.0.0.1:8000",
		"10.0.0.5:1",
		"10.0.0.5:65535",
		"[::1]:8000",
		"[2001:db8::7]:443",
		"[::ffff:10.0.0.1]:80",
		"engine-0:8000",
		"engine-0.pods.svc.cluster.local:8000",
		"Engine.Example:8000",
		"a:9",
		"x1:9",
		"0a.b:9",
		strings.Repeat("a", 63) + ".b:1",
	}
	bad := map[string]string{
		"127.0.0.1:4500/steal?x=":           "port that is not a decimal number",
		"127.0.0.1:4500?x=1":                "port that is not a decimal number",
		"127.0.0.1:4500#f":                  "port that is not a decimal number",
		"127.0.0.1/x:4500":                  "neither an IP address nor a DNS name",
		"user@127.0.0.1:4500":               "neither an IP address nor a DNS name",
		"user:pw@127.0.0.1:4500":            "IPv6 host without brackets",
		"127.0.0.1:4500 ":                   "port that is not a decimal number",
		" 127.0.0.1:4500":                   "neither an IP address nor a DNS name",
		"127.0.0.1 :4500":                   "neither an IP address nor a DNS name",
		"engine\t0:4500":                    "neither an IP address nor a DNS name",
		"engine%2e0:4500":                   "neither an IP address nor a DNS name",
		"127.0.0.1":                         "has no port",
		"engine":                            "has no port",
		"":                                  "has no port",
		"127.0.0.1:":                        "has no port",
		":8000":                             "has no host",
		"127.0.0.1:0":                       "outside [1, 65535]",
		"127.0.0.1:65536":                   "outside [1, 65535]",
		"127.0.0.1:123456":                  "outside [1, 65535]",
		"127.0.0.1:+80":                     "not a decimal number",
		"127.0.0.1:-80":                     "not a decimal number",
		"127.0.0.1:080":                     "leading zero",
		"127.0.0.1:0x50":                    "not a decimal number",
		"::1:8000":                          "IPv6 host without brackets",
		"2001:db8::7:443":                   "IPv6 host without brackets",
		"[::1]":                             "not a decimal number",
		"[::1:8000":                         "bracketed host that is not an IPv6",
		"[127.0.0.1]:8000":                  "bracketed host that is not an IPv6",
		"[engine]:8000":                     "bracketed host that is not an IPv6",
		"[fe80::1%eth0]:8000":               "bracketed host that is not an IPv6",
		"[fe80::1%25eth0]:8000":             "bracketed host that is not an IPv6",
		"[::1]x:8000":                       "bracketed host that is not an IPv6",
		"-engine:8000":                      "hyphen",
		"engine-:8000":                      "hyphen",
		"engine..svc:8000":                  "empty label",
		".engine:8000":                      "empty label",
		"engine.:8000":                      "empty label",
		"under_score:8000":                  "neither an IP address nor a DNS name",
		"1.2.3:8000":                        "neither an IP address nor a DNS name",
		"999.0.0.1:8000":                    "neither an IP address nor a DNS name",
		"1.2.3.4.5:8000":                    "neither an IP address nor a DNS name",
		"h\u00e9te:8000":                    "neither an IP address nor a DNS name",
		strings.Repeat("a", 64) + ".b:1":    "longer than 63",
		strings.Repeat("a.", 127) + "ab:1":  "longer than 253",
		"127.0.0.1:4500\n":                  "not a decimal number",
		"127.0.0.1:4500/v1/completions?x=y": "not a decimal number",
	}
	for _, name := range good {
		if err := CheckName(name); err != nil {
			t.Errorf("CheckName(%q) = %v, want nil", name, err)
		}
	}
	for name, why := range bad {
		err := CheckName(name)
		if !errors.Is(err, ErrBadName) || !strings.Contains(err.Error(), why) {
			t.Errorf("CheckName(%q) = %v, want ErrBadName with %q", name, err, why)
		}
	}
}

// MaxDPSize is one past the KV events config's highest dp_rank: the
// largest instance the directory can address whole.
func TestMaxDPSizeIsConfigRange(t *testing.T) {
	stream := func(rank int) []byte {
		return fmt.Appendf(nil, `{"streams":[{"instance_name":"127.0.0.1:8000","dp_rank":%d,"endpoint":"tcp://127.0.0.1:1","replay_endpoint":"tcp://127.0.0.1:2"}]}`, rank)
	}
	if _, err := config.Parse(stream(MaxDPSize - 1)); err != nil {
		t.Errorf("dp_rank %d refused by config: %v", MaxDPSize-1, err)
	}
	if _, err := config.Parse(stream(MaxDPSize)); err == nil || !strings.Contains(err.Error(), "dp_rank") {
		t.Errorf("dp_rank %d: %v, want the config to refuse it", MaxDPSize, err)
	}
}

// Issue 10 items 4 and 5: a registration under a name that is not
// host:port, or with dp_size above MaxDPSize, is never registered (so
// never routed to or subscribed); the warning names the instance and
// the value; a bad refresh of a registered instance leaves it as it was.
func TestBadRegistrationsRefused(t *testing.T) {
	srv := startEtcd(t)
	cli := newClient(t, srv.Endpoint())
	logs := &testlog.Buffer{}
	opts := fastOptions()
	opts.Logger = logs.Logger(slog.LevelWarn)
	reg := startRegistry(t, cli, opts)

	badNames := []string{"127.0.0.1:4500/steal?x=", "user@10.0.0.1:80", "::1:8000", "10.0.0.1:0", "engine 1:80"}
	for _, name := range badNames {
		put(t, cli, engineKey("", Prefill, name), engineMeta(name, Prefill, "x").json(t))
	}
	for _, dp := range []int{MaxDPSize + 1, 35534} {
		name := fmt.Sprintf("127.0.0.1:%d", 9000+dp%1000)
		put(t, cli, engineKey("", Prefill, name), engineMeta(name, Prefill, "x").with("dp_size", dp).json(t))
	}
	most := "127.0.0.1:8999"
	put(t, cli, engineKey("", Prefill, most), engineMeta(most, Prefill, "m").with("dp_size", MaxDPSize).json(t))
	if in := waitInst(t, reg.Registry, most, "dp_size at the bound", inState(Active)); in.Meta.DPSize != MaxDPSize {
		t.Errorf("dp_size %d registered as %d", MaxDPSize, in.Meta.DPSize)
	}
	if n := len(reg.Snapshot().Instances); n != 1 {
		t.Fatalf("%d instances, want only the valid one:\n%s", n, dump(reg.Snapshot()))
	}
	for _, name := range badNames {
		if logs.Count(name) == 0 {
			t.Errorf("no warning names %q:\n%s", name, logs.String())
		}
	}
	if n := logs.Count("ignoring instance registration"); n != len(badNames) {
		t.Errorf("%d name warnings for %d bad names:\n%s", n, len(badNames), logs.String())
	}
	for _, want := range []string{"dp_size 1025 is outside [0, 1024]", "dp_size 35534 is outside [0, 1024]", "instance=127.0.0.1:9025", "instance=127.0.0.1:9534"} {
		if logs.Count(want) != 1 {
			t.Errorf("no single warning with %q:\n%s", want, logs.String())
		}
	}

	// A registered instance whose key is overwritten with a refused value
	// (a new process with too many ranks, say) is withdrawn, not kept as
	// it was: what runs at that address is no longer the entry kvcar knew.
	put(t, cli, engineKey("", Prefill, most), engineMeta(most, Prefill, "m2").with("dp_size", MaxDPSize+1).json(t))
	marker := "127.0.0.1:8998"
	put(t, cli, engineKey("", Prefill, marker), engineMeta(marker, Prefill, "k").json(t))
	waitInst(t, reg.Registry, marker, "marker after the bad refresh", inState(Active))
	if in, ok := reg.Lookup(most); ok {
		t.Errorf("an instance whose registration was replaced by a refused one is still listed: %+v", in)
	}
	if logs.Count("instance withdrawn") != 1 {
		t.Errorf("no single withdrawal warning:\n%s", logs.String())
	}
	// A valid registration at the same address registers again.
	put(t, cli, engineKey("", Prefill, most), engineMeta(most, Prefill, "m3").json(t))
	waitInst(t, reg.Registry, most, "re-registration after the withdrawal", inState(Active))
}
