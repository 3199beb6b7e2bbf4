package config

import (
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// canonicalEndpoint checks that s is a connectable tcp://host:port address
// and returns a form in which two spellings of one address compare equal
// (lower-case host, canonical IP, port without leading zeros). On failure
// it returns the reason instead.
func canonicalEndpoint(s string) (string, string) {
	const syntax = "must be tcp://host:port"
	rest, ok := strings.CutPrefix(s, "tcp://")
	if !ok {
		return "", syntax + " (only the tcp transport is supported)"
	}
	if strings.ContainsAny(rest, "/?#@ \t\r\n") {
		return "", syntax + " without path, query or user part"
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return "", syntax + " (IPv6 hosts in brackets, e.g. tcp://[::1]:5557)"
	}
	if port == "" || strings.Trim(port, "0123456789") != "" || len(port) > 5 {
		return "", "port must be a number in [1, 65535]"
	}
	p, _ := strconv.Atoi(port)
	if p < 1 || p > 65535 {
		return "", "port must be a number in [1, 65535]"
	}
	bracketed := strings.HasPrefix(rest, "[")
	switch {
	case host == "":
		return "", "host is empty; a connectable host is required"
	case host == "*":
		return "", "host * is a bind wildcard; a connectable host is required"
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		if addr.IsUnspecified() {
			return "", "host " + host + " is the unspecified address; a connectable host is required"
		}
		if bracketed != addr.Is6() {
			return "", syntax + " (IPv6 hosts in brackets, IPv4 hosts without)"
		}
		return net.JoinHostPort(addr.String(), strconv.Itoa(p)), ""
	}
	if bracketed {
		return "", "host in brackets must be an IPv6 address"
	}
	if reason := checkHostName(host); reason != "" {
		return "", reason
	}
	return net.JoinHostPort(strings.ToLower(host), strconv.Itoa(p)), ""
}

// checkHostName accepts DNS names. A name made of digits and dots that is
// not a dotted-quad IPv4 address is rejected, since resolvers read forms
// such as "0" or "127.1" as (possibly wildcard) IPv4 addresses.
func checkHostName(h string) string {
	if len(h) > 253 {
		return "host name longer than 253 characters"
	}
	if strings.Trim(h, "0123456789.") == "" {
		return "host " + h + " is not a valid IPv4 address"
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 {
			return "host " + h + " has an empty or over-long label"
		}
		for _, r := range label {
			ok := r == '-' || r == '_' || (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')
			if !ok {
				return "host " + strconv.Quote(h) + " contains a character not allowed in a host name"
			}
		}
	}
	return ""
}

// bindEndpointError checks that s is a tcp://host:port address kvcar can
// bind: a wildcard host (*, 0.0.0.0, [::]) is allowed here, unlike in
// endpoints kvcar connects to. It returns "" or the reason.
func bindEndpointError(s string) string {
	rest, ok := strings.CutPrefix(s, "tcp://")
	if !ok {
		return "must be tcp://host:port (only the tcp transport is supported)"
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil || strings.ContainsAny(rest, "/?#@ \t\r\n") {
		return "must be tcp://host:port, e.g. tcp://*:5557 or tcp://0.0.0.0:5557"
	}
	if port == "" || strings.Trim(port, "0123456789") != "" || len(port) > 5 {
		return "port must be a number in [1, 65535]"
	}
	if p, _ := strconv.Atoi(port); p < 1 || p > 65535 {
		return "port must be a number in [1, 65535]"
	}
	switch {
	case host == "*":
		return ""
	case host == "":
		return "host is empty; use * to bind every interface"
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return ""
	}
	return checkHostName(host)
}

// BindPorts returns the endpoints of a bind address and the count of
// consecutive ports from its port on: tcp://*:5557 and 2 give
// tcp://*:5557 and tcp://*:5558. The address was checked by Parse.
func BindPorts(endpoint string, n int) []string {
	rest := strings.TrimPrefix(endpoint, "tcp://")
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return nil
	}
	p, _ := strconv.Atoi(port)
	out := make([]string, 0, n)
	for i := range n {
		out = append(out, "tcp://"+net.JoinHostPort(host, strconv.Itoa(p+i)))
	}
	return out
}

// BindIsLoopback reports whether a bind address checked by Parse binds
// loopback only (127.0.0.0/8, ::1 or localhost), so that no peer off
// this host can dial it. Anything else, a wildcard included, is not.
func BindIsLoopback(endpoint string) bool {
	host, _, err := net.SplitHostPort(strings.TrimPrefix(endpoint, "tcp://"))
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}
