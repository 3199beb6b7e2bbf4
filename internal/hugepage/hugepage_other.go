//go:build !linux

package hugepage

// Advise does nothing here: only Linux is given the advice.
func Advise[T any](s []T) bool { return false }
