//go:build !linux

package sysmon

// Reexec does nothing where the program cannot find its own binary as
// Linux's /proc/self/exe names it; the runtime keeps its default pace.
func Reexec(args, env []string) error { return nil }
