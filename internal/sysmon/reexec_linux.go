package sysmon

import (
	"fmt"
	"os"
	"syscall"
)

// Reexec replaces the running program with itself, same process, same
// arguments, under Env(env), unless env needs no change; it returns nil
// then. It must run first in main, before the program has started
// anything it would lose. On success it does not return. The exec'd
// program finds Setting in its GODEBUG and does not restart again.
func Reexec(args, env []string) error {
	next, changed := Env(env)
	if !changed {
		return nil
	}
	// The binary's own path, not /proc/self/exe: the kernel names the
	// process after the path it executes, and ps, pgrep and the like
	// must still see kvcar.
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("restart under GODEBUG=%s: %w", Setting, err)
	}
	if err := syscall.Exec(exe, args, next); err != nil {
		return fmt.Errorf("restart %s under GODEBUG=%s: %w", exe, Setting, err)
	}
	return nil
}
