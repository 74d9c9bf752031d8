package replica

import (
	"time"

	"golang.org/x/sys/unix"
)

// boottime reads CLOCK_BOOTTIME: monotonic, and — unlike Go's monotonic
// clock (CLOCK_MONOTONIC on Linux) — it keeps counting while the machine or
// VM is suspended, so a leader frozen past its lease sees the time that
// passed the moment it runs again.
func boottime() time.Duration {
	if !hasBoottime {
		return time.Since(processStart)
	}
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	return time.Duration(ts.Nano())
}

var processStart = time.Now()

// hasBoottime: CLOCK_BOOTTIME exists since Linux 2.6.39; a sandbox that
// refuses it leaves the monotonic clock (decided once, so readings never
// mix the two).
var hasBoottime = func() bool {
	var ts unix.Timespec
	return unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) == nil
}()
