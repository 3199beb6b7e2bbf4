//go:build !linux

package prefillgen

import "time"

// ThreadCPU reports that this platform cannot tell a thread's CPU time.
func ThreadCPU() (time.Duration, bool) { return 0, false }
