package freeport

import (
	"net"
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

// TestBaseWithOffsets asks for ports as an engine of two DP ranks binds
// them (its HTTP port and, at offsets from it, each rank's event and
// replay ports): every one must bind on host and lie outside the
// ephemeral range; offsets that leave no base fail.
func TestBaseWithOffsets(t *testing.T) {
	lo, hi := EphemeralRange()
	offsets := []int{0, 1000, 1001, 2000, 2001}
	for range 20 {
		base, err := Base("127.0.0.1", offsets)
		if err != nil {
			t.Fatal(err)
		}
		var held []net.Listener
		for _, off := range offsets {
			p := base + off
			if !Quiet(p, lo, hi) {
				t.Errorf("base %d: port %d lies in the ephemeral range %d..%d", base, p, lo, hi)
			}
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			if err != nil {
				t.Errorf("base %d: port %d is not free: %v", base, p, err)
				continue
			}
			held = append(held, l)
		}
		for _, l := range held {
			l.Close()
		}
	}
	for _, offsets := range [][]int{nil, {0, 70000}, {-70000, 0}} {
		if base, err := Base("127.0.0.1", offsets); err == nil {
			t.Errorf("Base(%v) = %d, want an error", offsets, base)
		}
	}
}

// TestQuietBases checks the bases whose every port lies outside the
// range, at its edges and where none is left.
func TestQuietBases(t *testing.T) {
	for _, c := range []struct {
		offsets        []int
		lo, hi         int
		eLo, eHi       int
		first, last, n int
	}{
		{[]int{0}, 1024, 65535, 32768, 60999, 1024, 65535, 65535 - 1024 + 1 - (60999 - 32768 + 1)},
		{[]int{0, 7}, 1024, 65528, 32768, 60999, 1024, 65528, 32760 - 1024 + 1 + 65528 - 61000 + 1},
		{[]int{0}, 1024, 65535, 1024, 65535, 0, 0, 0},
		{[]int{0, 3}, 1024, 65532, 1028, 65531, 1024, 65532, 2},
	} {
		got := quietBases(c.offsets, c.lo, c.hi, c.eLo, c.eHi)
		if len(got) != c.n {
			t.Errorf("quietBases(%v, %d, %d, %d, %d): %d bases, want %d", c.offsets, c.lo, c.hi, c.eLo, c.eHi, len(got), c.n)
			continue
		}
		if c.n > 0 && (got[0] != c.first || got[len(got)-1] != c.last) {
			t.Errorf("quietBases(%v, ...) runs %d..%d, want %d..%d", c.offsets, got[0], got[len(got)-1], c.first, c.last)
		}
		for _, b := range got {
			for _, off := range c.offsets {
				if !Quiet(b+off, c.eLo, c.eHi) {
					t.Fatalf("base %d: port %d lies in %d..%d", b, b+off, c.eLo, c.eHi)
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
