// Package prefetch asks the processor to start loading memory that a
// caller will read soon, without waiting for it: a plain load that misses
// the cache holds up every instruction after it once the processor's
// reorder window fills, while a prefetch does not, so the misses of many
// lookups can be in flight while other work goes on.
//
// It owns nothing else. A prefetch is a hint: it never faults, never
// changes what a program computes, and on architectures without an
// implementation here it does nothing.
package prefetch
