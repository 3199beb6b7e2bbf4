// Package cpuidle reads how this machine's idle CPUs wait for work, as far
// as it shapes the latency of a request that finds kvcar idle.
//
// On a virtual machine whose idle driver is cpuidle-haltpoll, an idle
// vCPU either polls for up to guest_halt_poll_ns before it halts, or,
// with that set to 0, halts at once and hands its physical CPU back to
// the hypervisor. A message that arrives then, an HTTP request or an
// engine's answer, waits for the hypervisor to run the vCPU again. At one
// client a request through a relay wakes it twice, and on the 2-core
// machine kvcar is measured on that added 0.1–1.5 ms to every request
// (README, "Idle CPUs on virtual machines").
//
// It owns reading the sysfs files that say so and nothing else: it
// changes no setting, which is the machine operator's to choose.
package cpuidle
