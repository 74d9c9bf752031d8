//go:build !unix

package producer

// processCPU is 0 where getrusage is missing: cpu-ns/op then reads 0.
func processCPU() int64 { return 0 }
