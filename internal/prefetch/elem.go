package prefetch

import "unsafe"

// Elem starts loading element i of s. i need not be within s: the
// address is only a hint.
func Elem[T any](s []T, i int) {
	var z T
	Addr(uintptr(unsafe.Pointer(unsafe.SliceData(s))) + uintptr(i)*unsafe.Sizeof(z))
}
