package main

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestRPCAllowedNetworks dials the rpc port's filtering listener from this
// machine's non-loopback address over real TCP: a peer outside
// --rpc_allowed_networks is closed at accept, one inside (or on loopback)
// is served, so a forged heartbeat from elsewhere never reaches the
// registry (issue 10 item 2, for the brpc plane).
func TestRPCAllowedNetworks(t *testing.T) {
	self := firstNonLoopback()
	if self == "127.0.0.1" {
		t.Fatal("this machine has no non-loopback IPv4 address to dial from")
	}
	serve := func(t *testing.T, networks string) string {
		t.Helper()
		nets, err := parseNetworks(networks)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := net.Listen("tcp", "0.0.0.0:0")
		if err != nil {
			t.Fatal(err)
		}
		ln := newAllowListener(raw, nets, slog.New(slog.DiscardHandler))
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() { defer c.Close(); _, _ = c.Write([]byte("served")) }()
			}
		}()
		_, port, _ := net.SplitHostPort(raw.Addr().String())
		return port
	}
	reply := func(t *testing.T, host, port string) (string, error) {
		t.Helper()
		c, err := net.DialTimeout("tcp", net.JoinHostPort(host, port), 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		b, err := io.ReadAll(c)
		return string(b), err
	}

	// A documentation network that does not hold this machine's address.
	other := "203.0.113.0/24"
	if n, _ := parseNetworks(other); n[0].Contains(netip.MustParseAddr(self)) {
		other = "198.51.100.0/24"
	}
	port := serve(t, other)
	if got, err := reply(t, self, port); got != "" || (err != nil && !isClosed(err)) {
		t.Errorf("peer %s outside %s got %q (%v), want the connection closed unserved", self, other, got, err)
	}
	if got, _ := reply(t, "127.0.0.1", port); got != "served" {
		t.Errorf("loopback peer got %q, want it served", got)
	}
	port = serve(t, other+","+self)
	if got, _ := reply(t, self, port); got != "served" {
		t.Errorf("peer %s in the allowed list got %q, want it served", self, got)
	}
}

func isClosed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op)
}

// TestParseNetworks: CIDRs and bare addresses are accepted, anything else
// names the flag and the item.
func TestParseNetworks(t *testing.T) {
	nets, err := parseNetworks(" 10.0.0.0/8, 192.0.2.7 ,fd00::/8,")
	if err != nil || len(nets) != 3 || nets[1].Bits() != 32 {
		t.Fatalf("parseNetworks = %v, %v", nets, err)
	}
	for _, bad := range []string{"10.0.0.0/33", "host.example", "10.0.0.1:80"} {
		if _, err := parseNetworks(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
