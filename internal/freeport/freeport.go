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

// lowest is the lowest port picked: below it only privileged ports.
const lowest = 1024

// attempts bounds the random picks for each port or set of ports; a busy
// machine fails them only when most of the port range is taken.
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
	eLo, eHi := EphemeralRange()
	quiet := quietBases([]int{0}, lowest, 65535, eLo, eHi)
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

// Run returns a port p such that p, p+1, ... p+n-1 are free on 127.0.0.1
// (Base with the offsets 0 to n-1): for servers that bind a run of ports
// from one base, a publisher's DP ranks.
func Run(n int) (int, error) {
	if n <= 0 || n > maxRun {
		return 0, fmt.Errorf("freeport: a run of %d ports asked for, want 1 to %d", n, maxRun)
	}
	offsets := make([]int, n)
	for i := range offsets {
		offsets[i] = i
	}
	return Base("127.0.0.1", offsets)
}

// Base returns a port b from lowest up such that b+off is free on host
// right now, and at most 65535, for every one of offsets: for a server
// that derives the ports it binds from one (an engine's HTTP port and
// the KV event ports kvcar's discovery adds to it). It prefers bases
// whose every port lies outside the ephemeral range, and picks them at
// random, which keeps concurrent callers apart. The ports are bound at
// once to check them and let go before Base returns, as with Loopback.
func Base(host string, offsets []int) (int, error) {
	if len(offsets) == 0 {
		return 0, errors.New("freeport: no offsets")
	}
	lo, hi := lowest, 65535
	for _, off := range offsets {
		lo = max(lo, 1-off)
		hi = min(hi, 65535-off)
	}
	if lo > hi {
		return 0, fmt.Errorf("freeport: offsets %v leave no base from %d with every port at most 65535", offsets, lowest)
	}
	eLo, eHi := EphemeralRange()
	quiet := quietBases(offsets, lo, hi, eLo, eHi)
	var lastErr error
	for range attempts {
		base := lo + rand.IntN(hi-lo+1)
		if len(quiet) > 0 {
			base = quiet[rand.IntN(len(quiet))]
		}
		if lastErr = portsFree(host, base, offsets); lastErr == nil {
			return base, nil
		}
	}
	return 0, fmt.Errorf("freeport: no free ports on %s at offsets %v in %d tries: %w", host, offsets, attempts, lastErr)
}

// quietBases returns the bases from lo to hi whose every port base+off
// lies outside the ephemeral range eLo..eHi.
func quietBases(offsets []int, lo, hi, eLo, eHi int) []int {
	var quiet []int
	for base := lo; base <= hi; base++ {
		ok := true
		for _, off := range offsets {
			if !Quiet(base+off, eLo, eHi) {
				ok = false
				break
			}
		}
		if ok {
			quiet = append(quiet, base)
		}
	}
	return quiet
}

// listenQuiet binds a random port of quiet on 127.0.0.1, or one the
// kernel picks when quiet is empty or every pick was taken.
func listenQuiet(quiet []int) (net.Listener, error) {
	var lastErr error
	for range attempts {
		if len(quiet) == 0 {
			break
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(quiet[rand.IntN(len(quiet))])))
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

// portsFree binds every base+offset port on host at once, so that the
// ports are known to be free together, and lets them go.
func portsFree(host string, base int, offsets []int) error {
	held := make([]net.Listener, 0, len(offsets))
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for _, off := range offsets {
		l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(base+off)))
		if err != nil {
			return err
		}
		held = append(held, l)
	}
	return nil
}
