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

// attempts bounds the random picks Loopback makes for each port.
const attempts = 256

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
	// The quiet ports: [lowest, lo) and (hi, 65535].
	below, above := max(0, lo-lowest), max(0, 65535-hi)
	held := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for len(ports) < n {
		l, err := listenQuiet(below, above, hi)
		if err != nil {
			return nil, err
		}
		held = append(held, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// listenQuiet binds a random quiet port, or one the kernel picks when
// there are none or every pick was taken.
func listenQuiet(below, above, hi int) (net.Listener, error) {
	var lastErr error
	for range attempts {
		if below+above == 0 {
			break
		}
		p := rand.IntN(below + above)
		if p < below {
			p += lowest
		} else {
			p += hi + 1 - below
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
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
