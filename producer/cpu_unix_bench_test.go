//go:build unix

package producer

import "syscall"

// processCPU returns the process's CPU time (user and system) in
// nanoseconds, for the benchmarks' cpu-ns/op beside their wall time (as
// ckf's benchmarks report it).
func processCPU() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}
