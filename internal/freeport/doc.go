// Package freeport finds free loopback TCP ports for servers whose ports
// are chosen before they bind them: an embedded etcd, which a restart
// binds again on the same ports; kvcar started as a child process; the
// tests' publishers; an emulated engine's HTTP port and the KV event
// ports derived from it.
//
// It picks ports outside the kernel's ephemeral range. Inside it, the
// kernel hands out ports to every socket that connects or listens on
// port 0, in any process: a port found free there, or let go for a
// restart, can be taken by another test's client connection before the
// server binds it again. Outside it, only a process that asks for that
// very port can take it.
//
// It owns choosing ports and nothing else: it binds nothing beyond the
// check, and callers bind their servers themselves.
package freeport
