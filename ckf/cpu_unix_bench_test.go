//go:build unix

package ckf_test

import "syscall"

// processCPU returns the process's CPU time (user and system) in
// nanoseconds. The apply benchmarks report it per op beside the wall time:
// on a loaded machine wall time swings with the other processes, while the
// CPU an op takes moves far less (cpu-ns/op; on the parallel benchmark it
// sums every worker's time, so it shows the work the stages add, not the
// speed).
func processCPU() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}
