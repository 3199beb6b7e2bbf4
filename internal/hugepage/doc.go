// Package hugepage asks the kernel to back large, densely used arrays with
// transparent huge pages, so that random reads across them miss the TLB
// less: a virtual machine's page walk is two-dimensional, and a table of
// hundreds of MiB read at random pays one on nearly every probe.
//
// It owns only that advice. It never allocates, never changes what the
// memory holds, and where the kernel or the platform gives no huge pages
// (another OS, transparent huge pages off) it does nothing.
package hugepage
