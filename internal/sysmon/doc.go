// Package sysmon decides how the Go runtime's system monitor (sysmon)
// paces itself in a kvcar process, and restarts the process under that
// setting.
//
// kvcar is idle most of the time between short bursts: a KV message from
// one of a hundred streams, a routing decision. Between bursts every P is
// idle and sysmon deep-sleeps; the next burst's first system call or cgo
// call wakes it again, and it then polls every 20 µs as a bet that
// system calls will block. On a core kvcar shares, each of those
// wake-ups preempts whatever kvcar was doing, a routing decision
// included. Following 128 streams, sysmon's thread switched about 1,900
// times a second, and kvcar's other threads were preempted some 560
// times a second; with the setting below, about 100 and under 30, and
// the decision's p99 fell with them (docs/performance-log.md,
// "Decision latency and the runtime's monitor").
//
// The runtime skips the deep sleep only while GODEBUG's schedtrace is
// positive; sysmon then settles at its slowest pace, every 10 ms, when
// it finds nothing to do. The trace the setting is named for is printed
// every schedtrace milliseconds: at the largest value, every 24.8 days
// of the machine's uptime (so possibly once at start, on a machine up
// longer than that).
//
// It owns the GODEBUG entry and the restart, nothing else: it never
// changes a setting the operator chose (GODEBUG naming schedtrace,
// schedtrace=0 included, is left as it is), and it reads and returns
// environments rather than changing this process's.
package sysmon
