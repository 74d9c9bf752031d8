//go:build !linux

package replica

import "time"

// boottime is Go's monotonic clock where CLOCK_BOOTTIME does not exist: it
// may stop while the machine sleeps, so a suspended leader can overrun its
// lease there (deploy HA relays on Linux; docs/deploy.md).
func boottime() time.Duration { return time.Since(processStart) }

var processStart = time.Now()
