package hugepage

import (
	"syscall"
	"unsafe"
)

// Advise marks the whole 2 MiB pages inside s's memory MADV_HUGEPAGE, so
// that the kernel backs them with huge pages when they are first touched
// (or later, through khugepaged) even where transparent huge pages are
// given only on request, as Debian's and Ubuntu's default "madvise" does.
// Arrays under MinBytes are left alone: a huge page or two saves little
// and the advice splits the mapping. It reports whether the advice was
// given; an error from the kernel (huge pages off) means it was not.
func Advise[T any](s []T) bool {
	if len(s) == 0 {
		return false
	}
	n := uintptr(len(s)) * unsafe.Sizeof(s[0])
	if n < MinBytes {
		return false
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), n)
	p := uintptr(unsafe.Pointer(&b[0]))
	from := (p+pageSize-1)&^(pageSize-1) - p
	to := (p+n)&^(pageSize-1) - p
	if to <= from {
		return false
	}
	return syscall.Madvise(b[from:to], syscall.MADV_HUGEPAGE) == nil
}
