package enginesim

import (
	"fmt"

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
	port, err := freeport.Base(host, offsets)
	if err != nil {
		return 0, fmt.Errorf("enginesim: discovery ports for offsets %d/%d with dp size %d: %w", eventOffset, replayOffset, dpSize, err)
	}
	return port, nil
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
