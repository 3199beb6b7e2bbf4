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
