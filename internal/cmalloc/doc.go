// Package cmalloc sets how the C allocator returns freed memory to the
// kernel in a kvcar process.
//
// libzmq allocates every message it receives that does not fit its read
// buffer (8 KB) with malloc, on its I/O thread, and kvcar frees it once
// copied. A KV event message of a long prompt's prefill is tens to
// hundreds of kilobytes. glibc, by default, gives the free space at the
// top of a thread's heap back to the kernel as soon as it exceeds 128 KB
// (madvise, a TLB shootdown across the cores), and the next message then
// faults every page in again while the kernel copies the socket's bytes
// into it. With prompts of 16,384 ids through emulated xLLM engines that
// cost about a sixth of kvcar's CPU (docs/performance-log.md,
// "The xLLM path at 16,384 ids").
//
// Keep raises the size below which malloc serves a request from its
// heaps rather than mapping it alone, and the free space a heap keeps,
// so that the memory of one message is reused by the next. It owns the
// process's mallopt settings and nothing else, and it never changes a
// setting the operator chose: GLIBC_TUNABLES naming either threshold, or
// glibc's older MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_, is
// left to rule.
package cmalloc
