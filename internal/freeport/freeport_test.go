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
