package ckf_test

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
)

// hostScaleEntries is the size of each of BenchmarkHostScaling's two maps:
// 4,194,304 refcount-like entries (≈ 100 MB), far beyond any cache, like the
// pool's exact state at DC scale.
const hostScaleEntries = 1 << 22

// hostScaleMaps holds the two maps, built once per process.
var hostScaleMaps struct {
	once sync.Once
	m    [2]map[uint64]uint32
	keys [2][]uint64
}

// xorshift is a cheap PRNG step for the probe sequences.
func xorshift(x uint64) uint64 {
	x ^= x << 13
	x ^= x >> 7
	x ^= x << 17
	return x
}

// BenchmarkHostScaling measures how far this machine runs two independent
// goroutines faster than one, the ceiling of any parallel apply on it
// (docs/RATIONALE.md "Why is apply_workers GOMAXPROCS by default?"). One op is one
// unit of work on each of two independent data sets: impl=one does both on
// one goroutine, impl=two gives each to its own goroutine. work=map is the
// exact state's shape (a random read-modify-write of a 4 M-entry
// map[uint64]uint32, memory-latency bound); work=spin is pure arithmetic
// (the CPU ceiling). probes/s counts both data sets' units.
func BenchmarkHostScaling(b *testing.B) {
	hostScaleMaps.once.Do(func() {
		for i := range hostScaleMaps.m {
			m := make(map[uint64]uint32, hostScaleEntries)
			keys := make([]uint64, hostScaleEntries)
			x := uint64(i + 1)
			for j := range keys {
				x = xorshift(x)
				m[x] = 1
				keys[j] = x
			}
			hostScaleMaps.m[i], hostScaleMaps.keys[i] = m, keys
		}
	})
	var sink [2]uint64
	units := map[string]func(set, n int){
		"map": func(set, n int) {
			m, keys := hostScaleMaps.m[set], hostScaleMaps.keys[set]
			x := uint64(set + 11)
			var s uint64
			for range n {
				x = xorshift(x)
				k := keys[x%uint64(len(keys))]
				m[k]++
				s += uint64(m[k])
			}
			sink[set] = s
		},
		"spin": func(set, n int) {
			x := uint64(set + 11)
			for range n * 64 {
				x = xorshift(x)
			}
			sink[set] = x
		},
	}
	for _, work := range []string{"map", "spin"} {
		unit := units[work]
		for _, impl := range []string{"one", "two"} {
			b.Run(fmt.Sprintf("work=%s/impl=%s", work, impl), func(b *testing.B) {
				if impl == "two" && runtime.GOMAXPROCS(0) < 2 {
					b.Skip("GOMAXPROCS < 2")
				}
				b.ResetTimer()
				if impl == "one" {
					unit(0, b.N)
					unit(1, b.N)
				} else {
					var wg sync.WaitGroup
					for set := range 2 {
						wg.Go(func() { unit(set, b.N) })
					}
					wg.Wait()
				}
				b.StopTimer()
				b.ReportMetric(float64(2*b.N)/b.Elapsed().Seconds(), "probes/s")
			})
		}
	}
}
