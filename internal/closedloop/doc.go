// Package closedloop drives an HTTP endpoint for benchmarks: a number of
// clients, each posting its next request when the last is answered, and
// the latencies they saw.
//
// It is imported by tests only and imports nothing of kvcar.
package closedloop
