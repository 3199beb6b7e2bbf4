package freeport

import (
	"net"
	"slices"
	"strconv"
	"testing"
)

// TestLoopbackPortsAreDistinctFreeAndQuiet asks for sets of ports as an
// embedded etcd does (its client, inner and peer ports): each set's ports
// must differ, bind on loopback, and lie outside the kernel's ephemeral
// range, where no socket of another process gets one unasked.
func TestLoopbackPortsAreDistinctFreeAndQuiet(t *testing.T) {
	lo, hi := EphemeralRange()
	if lo > hi || lo <= 0 || hi > 65535 {
		t.Fatalf("ephemeral range %d..%d", lo, hi)
	}
	roomOutside := lo > lowest || hi < 65535
	for range 50 {
		ports, err := Loopback(3)
		if err != nil {
			t.Fatal(err)
		}
		if len(ports) != 3 {
			t.Fatalf("%d ports, want 3", len(ports))
		}
		var held []net.Listener
		for i, p := range ports {
			if roomOutside && !Quiet(p, lo, hi) {
				t.Errorf("port %d lies in the ephemeral range %d..%d", p, lo, hi)
			}
			for _, q := range ports[:i] {
				if p == q {
					t.Errorf("port %d returned twice in %v", p, ports)
				}
			}
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			if err != nil {
				t.Errorf("port %d is not free: %v", p, err)
				continue
			}
			held = append(held, l)
		}
		for _, l := range held {
			l.Close()
		}
	}
}

// TestRunIsFreeAndQuiet asks for runs of ports as a publisher of several
// DP ranks binds them: every port of the run must bind on loopback and
// lie outside the ephemeral range.
func TestRunIsFreeAndQuiet(t *testing.T) {
	lo, hi := EphemeralRange()
	roomOutside := lo > lowest+8 || hi < 65535-8
	for _, n := range []int{1, 2, 8} {
		for range 20 {
			base, err := Run(n)
			if err != nil {
				t.Fatal(err)
			}
			var held []net.Listener
			for p := base; p < base+n; p++ {
				if roomOutside && !Quiet(p, lo, hi) {
					t.Errorf("run of %d from %d: port %d lies in the ephemeral range %d..%d", n, base, p, lo, hi)
				}
				l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
				if err != nil {
					t.Errorf("run of %d from %d: port %d is not free: %v", n, base, p, err)
					continue
				}
				held = append(held, l)
			}
			for _, l := range held {
				l.Close()
			}
		}
	}
	for _, n := range []int{0, -1, maxRun + 1} {
		if base, err := Run(n); err == nil {
			t.Errorf("Run(%d) = %d, want an error", n, base)
		}
	}
}

// TestQuietBases checks the spans of bases whose whole run lies outside
// the range, at its edges and where no run fits.
func TestQuietBases(t *testing.T) {
	for _, c := range []struct {
		n, lo, hi int
		want      []span
	}{
		{1, 32768, 60999, []span{{lowest, 32767}, {61000, 65535}}},
		{8, 32768, 60999, []span{{lowest, 32760}, {61000, 65528}}},
		{1, 1024, 65535, nil},
		{8, 10005, 65530, nil},
		{4, 10004, 65531, []span{{lowest, lowest}, {65532, 65532}}},
	} {
		got := quietBases(c.n, c.lo, c.hi)
		if !slices.Equal(got, c.want) {
			t.Errorf("quietBases(%d, %d, %d) = %v, want %v", c.n, c.lo, c.hi, got, c.want)
		}
		for range 100 {
			if len(got) == 0 {
				break
			}
			b := pick(got)
			for p := b; p < b+c.n; p++ {
				if !Quiet(p, c.lo, c.hi) || p < lowest || p > 65535 {
					t.Fatalf("pick gave base %d, whose run of %d holds port %d (range %d..%d)", b, c.n, p, c.lo, c.hi)
				}
			}
		}
	}
}

func TestLoopbackRefusesNoPorts(t *testing.T) {
	for _, n := range []int{0, -1} {
		if ports, err := Loopback(n); err == nil {
			t.Errorf("Loopback(%d) = %v, want an error", n, ports)
		}
	}
}

func TestQuiet(t *testing.T) {
	for _, c := range []struct {
		port int
		want bool
	}{{32767, true}, {32768, false}, {45000, false}, {60999, false}, {61000, true}} {
		if got := Quiet(c.port, 32768, 60999); got != c.want {
			t.Errorf("Quiet(%d, 32768, 60999) = %v, want %v", c.port, got, c.want)
		}
	}
}
