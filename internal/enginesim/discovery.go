package enginesim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"

	"github.com/kvcar/kvcar/internal/freeport"
)

// DiscoveryOffsets are the port offsets kvcar's discovery adds to an
// instance's HTTP port, and then the DP rank, to find its KV endpoints
// (R-CFG-3, R-DISC-2).
type DiscoveryOffsets struct {
	Event, Replay int
}

// DefaultDiscoveryOffsets returns the offsets kvcar uses when its
// discovery config leaves them out.
func DefaultDiscoveryOffsets() *DiscoveryOffsets {
	return &DiscoveryOffsets{Event: DefaultEventPortOffset, Replay: DefaultReplayPortOffset}
}

// freePortAttempts bounds the search for a free set of ports; a busy
// machine fails it only when most of the port range is taken.
const freePortAttempts = 256

// FreeDiscoveryPort finds an HTTP port on 127.0.0.1 such that it and every
// port the discovery rule derives from it for dpSize ranks are free right
// now and at most 65535. Another process may still take one before the
// engine binds it; random bases keep concurrent callers apart.
func FreeDiscoveryPort(dpSize, eventOffset, replayOffset int) (int, error) {
	return freeDiscoveryPort("127.0.0.1", dpSize, false, eventOffset, replayOffset)
}

// FreeRankServersPort is FreeDiscoveryPort for vLLM's external data
// parallelism, where rank r is its own server at base+r: the ranks' HTTP
// ports are checked free too, not only the base's.
func FreeRankServersPort(ranks, eventOffset, replayOffset int) (int, error) {
	return freeDiscoveryPort("127.0.0.1", ranks, true, eventOffset, replayOffset)
}

func freeDiscoveryPort(host string, dpSize int, rankServers bool, eventOffset, replayOffset int) (int, error) {
	offsets, err := discoveryPortOffsets(dpSize, rankServers, eventOffset, replayOffset)
	if err != nil {
		return 0, err
	}
	lo, hi := 1024, 65535
	for _, off := range offsets {
		lo = max(lo, 1-off)
		hi = min(hi, 65535-off)
	}
	if lo > hi {
		return 0, fmt.Errorf("enginesim: offsets %d/%d with dp size %d leave no valid HTTP port",
			eventOffset, replayOffset, dpSize)
	}
	// Prefer bases whose every derived port lies outside the kernel's
	// ephemeral range, where the OS hands out ports to other sockets at
	// any moment and a port found free could be taken before the bind.
	var quiet []int
	ephLo, ephHi := freeport.EphemeralRange()
	for base := lo; base <= hi; base++ {
		ok := true
		for _, off := range offsets {
			if p := base + off; !freeport.Quiet(p, ephLo, ephHi) {
				ok = false
				break
			}
		}
		if ok {
			quiet = append(quiet, base)
		}
	}
	var lastErr error
	for range freePortAttempts {
		base := lo + rand.IntN(hi-lo+1)
		if len(quiet) > 0 {
			base = quiet[rand.IntN(len(quiet))]
		}
		if lastErr = portsFree(host, base, offsets); lastErr == nil {
			return base, nil
		}
	}
	return 0, fmt.Errorf("enginesim: no free discovery ports on %s after %d attempts: %w", host, freePortAttempts, lastErr)
}

// discoveryPortOffsets lists the offsets from the base HTTP port of every
// port an engine of dpSize ranks binds, or of dpSize rank servers at
// base+r when rankServers is set.
func discoveryPortOffsets(dpSize int, rankServers bool, eventOffset, replayOffset int) ([]int, error) {
	if dpSize <= 0 {
		return nil, fmt.Errorf("enginesim: dp size %d is not positive", dpSize)
	}
	offsets := []int{0}
	seen := map[int]bool{0: true}
	for dp := 0; dp < dpSize; dp++ {
		ports := []int{eventOffset + dp, replayOffset + dp}
		if rankServers && dp > 0 {
			ports = append(ports, dp)
		}
		for _, off := range ports {
			if seen[off] {
				return nil, fmt.Errorf("enginesim: offsets %d/%d with dp size %d put two endpoints on one port",
					eventOffset, replayOffset, dpSize)
			}
			seen[off] = true
			offsets = append(offsets, off)
		}
	}
	return offsets, nil
}

// portsFree binds every base+offset port at once, so that the ports are
// known to be free together, and releases them.
func portsFree(host string, base int, offsets []int) error {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for _, off := range offsets {
		l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(base+off)))
		if err != nil {
			return err
		}
		ls = append(ls, l)
	}
	if len(ls) == 0 {
		return errors.New("no ports to check")
	}
	return nil
}
