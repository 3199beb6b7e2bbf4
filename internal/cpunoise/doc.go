// Package cpunoise measures what a CPU-bound thread loses to everything
// else on its CPU: the kernel's ticks and interrupts, other threads and,
// on a virtual machine, the hypervisor running other guests on the
// physical core. A thread that only reads the clock sees each such
// interruption as a gap between two readings.
//
// From one recorded trace it derives the bound that no code running
// there could beat: how long a unit of CPU work of a given length takes
// when started at any moment of the trace. A latency goal of tens of
// microseconds is only meaningful against that bound
// (docs/performance-log.md, "The machine's share of the tail").
//
// It owns the recording and its arithmetic. It pins nothing (the caller
// chooses the CPU, see devcluster.RunOnCPUs) and must not import any
// other part of kvcar.
package cpunoise
