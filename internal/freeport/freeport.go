package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// Linux's default ephemeral range, used when the kernel's cannot be read.
const (
	defaultEphemeralLo = 32768
	defaultEphemeralHi = 60999
)

// lowest is the lowest port picked: below it lie the ports well-known
// services bind.
const lowest = 10000

// attempts bounds the random picks for each port or run of ports.
const attempts = 256

// maxRun bounds the run of ports Run finds.
const maxRun = 1024

// EphemeralRange is the kernel's range for automatically assigned ports
// (Linux's default when it cannot be read).
func EphemeralRange() (lo, hi int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return defaultEphemeralLo, defaultEphemeralHi
	}
	f := strings.Fields(string(b))
	if len(f) == 2 {
		l, err1 := strconv.Atoi(f[0])
		h, err2 := strconv.Atoi(f[1])
		if err1 == nil && err2 == nil && 0 < l && l <= h && h <= 65535 {
			return l, h
		}
	}
	return defaultEphemeralLo, defaultEphemeralHi
}

// Quiet reports whether port lies outside the ephemeral range lo..hi.
func Quiet(port, lo, hi int) bool { return port < lo || port > hi }

// Loopback returns n distinct ports free on 127.0.0.1, outside the
// ephemeral range where it leaves room for them, and inside it (as the
// kernel picks them) where it does not. The ports are bound at once
// while they are picked, so none is returned twice, and let go before
// Loopback returns: a port can still be taken before the caller binds
// it, by a process that asks for that very port, and a caller retries
// with new ports when its bind fails.
func Loopback(n int) ([]int, error) {
	if n <= 0 {
		return nil, fmt.Errorf("freeport: %d ports asked for, want at least 1", n)
	}
	lo, hi := EphemeralRange()
	quiet := quietBases(1, lo, hi)
	held := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for len(ports) < n {
		l, err := listenQuiet(quiet)
		if err != nil {
			return nil, err
		}
		held = append(held, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Run returns a port p such that p, p+1, ... p+n-1 are free on 127.0.0.1,
// outside the ephemeral range where it leaves room for them: for servers
// that bind a run of ports from one base (a publisher's DP ranks). The
// ports are let go before Run returns, as with Loopback.
func Run(n int) (int, error) {
	if n <= 0 || n > maxRun {
		return 0, fmt.Errorf("freeport: a run of %d ports asked for, want 1 to %d", n, maxRun)
	}
	lo, hi := EphemeralRange()
	quiet := quietBases(n, lo, hi)
	var lastErr error
	for range attempts {
		base := 0
		if len(quiet) > 0 {
			base = pick(quiet)
		} else {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return 0, fmt.Errorf("freeport: no free loopback port: %w", err)
			}
			base = l.Addr().(*net.TCPAddr).Port
			l.Close()
			if base+n-1 > 65535 {
				continue
			}
		}
		if lastErr = runFree(base, n); lastErr == nil {
			return base, nil
		}
	}
	return 0, fmt.Errorf("freeport: no run of %d free loopback ports in %d tries: %w", n, attempts, lastErr)
}

// span is the bases first..last.
type span struct{ first, last int }

// quietBases returns the spans of bases b whose run b .. b+n-1 lies
// wholly outside the ephemeral range lo..hi, at or above lowest.
func quietBases(n, lo, hi int) []span {
	var s []span
	if last := lo - n; last >= lowest {
		s = append(s, span{lowest, last})
	}
	if first := max(hi+1, lowest); first+n-1 <= 65535 {
		s = append(s, span{first, 65535 - n + 1})
	}
	return s
}

// pick returns a base of spans, each equally likely.
func pick(spans []span) int {
	total := 0
	for _, s := range spans {
		total += s.last - s.first + 1
	}
	k := rand.IntN(total)
	for _, s := range spans {
		if size := s.last - s.first + 1; k >= size {
			k -= size
			continue
		}
		return s.first + k
	}
	panic("freeport: pick out of its spans")
}

// listenQuiet binds a random port of quiet, or one the kernel picks when
// quiet is empty or every pick was taken.
func listenQuiet(quiet []span) (net.Listener, error) {
	var lastErr error
	for range attempts {
		if len(quiet) == 0 {
			break
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(pick(quiet))))
		if err == nil {
			return l, nil
		}
		lastErr = err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("freeport: no free loopback port: %w", errors.Join(err, lastErr))
	}
	return l, nil
}

// runFree binds base .. base+n-1 at once and lets them go.
func runFree(base, n int) error {
	held := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for p := base; p < base+n; p++ {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			return err
		}
		held = append(held, l)
	}
	return nil
}
