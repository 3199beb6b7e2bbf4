package main

import (
	"fmt"
	"log/slog"
	"net"
)

// checkInternalExposure refuses an internal listener that the network can
// reach while no token guards it: it takes heartbeats, which decide where
// requests go, and shows the fleet and the process's profiles. Loopback
// is safe without a token (development, make run); anything else needs
// one, or the operator's explicit --insecure_internal_api, which is
// logged as a warning at every start.
func checkInternalExposure(f *flags, tokenSet bool, bound net.Addr, log *slog.Logger) error {
	if tokenSet || isLoopback(bound) {
		return nil
	}
	if !f.insecureInternal {
		return fmt.Errorf("--internal_host=%q: the internal listener %s is reachable from the network and no internal API token is set; "+
			"set a token (--internal_api_token_file or %s), keep --internal_host on loopback, "+
			"or pass --insecure_internal_api to serve heartbeat intake, the query API, the status page, /metrics and the profiler to anyone who can connect",
			f.internalHost, bound, tokenEnv)
	}
	log.Warn("--insecure_internal_api: the internal listener is reachable from the network without a token; "+
		"anyone who can connect can forge heartbeats, read the instance list and the profiler", "internal", bound.String())
	return nil
}

func isLoopback(a net.Addr) bool {
	tcp, ok := a.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}

// advertisedAddr is the host:port written to XLLM:SERVICE:MASTER and
// XLLM:SERVICE:<self>, where engines send heartbeats: the port of bound
// (the rpc listener, on --internal_host), at --advertise_host, else
// --internal_host when it names one address, else this machine's first
// non-loopback address. An address engines elsewhere would be given but
// could never reach (a non-loopback host for a listener on loopback) is
// refused.
func advertisedAddr(f *flags, internal net.Addr) (string, error) {
	_, port, _ := net.SplitHostPort(internal.String())
	host := f.advertiseHost
	if host == "" {
		host = f.internalHost
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = firstNonLoopback()
	}
	if ip := net.ParseIP(host); ip != nil && !ip.IsLoopback() && isLoopback(internal) {
		return "", fmt.Errorf("--advertise_host=%q: engines would send heartbeats to %s, but the internal listener is on loopback (%s); "+
			"set --internal_host to an address they can reach", f.advertiseHost, net.JoinHostPort(host, port), internal)
	}
	return net.JoinHostPort(host, port), nil
}

func firstNonLoopback() string {
	addrs, err := net.InterfaceAddrs()
	if err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
				return ipn.IP.String()
			}
		}
	}
	return "127.0.0.1"
}

// portFlagName is the flag the public port came from, for messages.
func portFlagName(f *flags) string {
	if f.portAlias {
		return "--port"
	}
	return "--http_server_port"
}
