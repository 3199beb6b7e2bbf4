package main

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"
)

// parseNetworks reads --rpc_allowed_networks: comma-separated CIDRs, or
// bare addresses taken as one host each.
func parseNetworks(list string) ([]netip.Prefix, error) {
	var nets []netip.Prefix
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if p, err := netip.ParsePrefix(item); err == nil {
			nets = append(nets, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(item)
		if err != nil {
			return nil, fmt.Errorf("--rpc_allowed_networks: %q is neither a CIDR (10.0.0.0/16) nor an IP address", item)
		}
		nets = append(nets, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return nets, nil
}

// checkRPCExposure refuses an rpc listener reachable from the network
// that would take heartbeats from anyone: xLLM's baidu_std calls carry
// no credentials, so the peer's address is the only check there is.
func checkRPCExposure(f *flags, nets []netip.Prefix, bound net.Addr, log *slog.Logger) error {
	if isLoopback(bound) || len(nets) > 0 {
		return nil
	}
	if !f.insecureInternal {
		return fmt.Errorf("--internal_host=%q: the rpc listener %s (--rpc_server_port) is reachable from the network and "+
			"--rpc_allowed_networks is empty; name the engines' networks there, keep --internal_host on loopback, "+
			"or pass --insecure_internal_api to take heartbeats and generations from anyone who can connect",
			f.internalHost, bound)
	}
	log.Warn("--insecure_internal_api: the rpc listener is reachable from the network and takes heartbeats and generations from any peer",
		"rpc", bound.String())
	return nil
}

// allowListener closes, at accept, connections whose peer is neither on
// loopback nor in nets. Refusals are logged at most once a minute, with
// the count since the last line, so a scan cannot flood the log.
type allowListener struct {
	net.Listener
	nets     []netip.Prefix
	log      *slog.Logger
	refused  atomic.Int64
	lastLogs atomic.Int64 // unix nanoseconds of the last refusal line
}

func newAllowListener(ln net.Listener, nets []netip.Prefix, log *slog.Logger) net.Listener {
	if len(nets) == 0 {
		return ln
	}
	return &allowListener{Listener: ln, nets: nets, log: log}
}

func (l *allowListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.allowed(c.RemoteAddr()) {
			return c, nil
		}
		_ = c.Close()
		n := l.refused.Add(1)
		now := time.Now().UnixNano()
		if last := l.lastLogs.Load(); now-last >= int64(time.Minute) && l.lastLogs.CompareAndSwap(last, now) {
			l.log.Warn("rpc connection refused: peer not in --rpc_allowed_networks", "peer", c.RemoteAddr().String(), "refused_total", n)
		}
	}
}

func (l *allowListener) allowed(a net.Addr) bool {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return false
	}
	ip := ap.Addr().Unmap()
	if ip.IsLoopback() {
		return true
	}
	for _, p := range l.nets {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}
