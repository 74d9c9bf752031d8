package ckf

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var kernelSink uint64

// reportP50 reports the median of the per-op durations in d, divided by
// per, as p50-ns: on a shared machine the median of individually timed ops
// is far steadier than the mean that ns/op reports.
func reportP50(b *testing.B, d []time.Duration, per int) {
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)/2].Nanoseconds())/float64(per), "p50-ns")
}

// BenchmarkKernels compares each batch kernel (impl=kernel) with the
// per-item Go reference it replaces (impl=go) over a 1024-block request of
// 16-token blocks, side by side in one run; p50-ns is per block. Off wasm
// both are Go; the ratio that decides whether a kernel stays is the wasm one
// (BENCHMARKS.md, "Wasm kernels").
func BenchmarkKernels(b *testing.B) {
	const blocks, blockSize = 1024, 16
	tokens := make([]uint32, blocks*blockSize)
	for i := range tokens {
		tokens[i] = uint32(benchKeyLike(uint64(i)))
	}
	dst := make([]uint64, blocks)
	for _, k := range []struct {
		name string
		fn   func()
	}{
		{"hashBlocks/impl=kernel", func() { hashBlocks(dst, tokens, blockSize, BaseSalt) }},
		{"hashBlocks/impl=go", func() { hashBlocksGo(dst, tokens, blockSize, BaseSalt) }},
		{"sequence/impl=kernel", func() { AppendTokenSequenceHashes(dst[:0], tokens, blockSize, BaseSalt) }},
		{"sequence/impl=twokernels", func() {
			useSeq64 = false
			AppendTokenSequenceHashes(dst[:0], tokens, blockSize, BaseSalt)
			useSeq64 = true
		}},
		{"sequence/impl=go", func() { tokenSequenceGo(dst, tokens, blockSize, BaseSalt) }},
		{"sequence/impl=gotwopass", func() { hashBlocksGo(dst, tokens, blockSize, BaseSalt); chainInPlaceGo(dst) }},
		{"chain/impl=kernel", func() { chainInPlace(dst) }},
		{"chain/impl=go", func() { chainInPlaceGo(dst) }},
	} {
		b.Run(k.name, func(b *testing.B) {
			d := make([]time.Duration, 0, 1024)
			for b.Loop() {
				t0 := time.Now()
				k.fn()
				d = append(d, time.Since(t0))
			}
			kernelSink += dst[blocks-1]
			reportP50(b, d, blocks)
		})
	}
}

// BenchmarkLaneRowHits: one 16-lane probe (address and row test) over keys
// that differ every call, kernel against the Go reference, on a
// cache-resident table (128 KiB) and on a 64 MiB one; p50-ns is per probe,
// from batches of 64.
func BenchmarkLaneRowHits(b *testing.B) {
	for _, buckets := range []uint64{1 << 10, 1 << 19} {
		words := make([]uint64, buckets*MaxLanes)
		for i := range words {
			words[i] = benchKeyLike(uint64(i))
		}
		ad := NewAddresser(DefaultSeed, buckets)
		for _, k := range []struct {
			name string
			fn   func(Addresser, []uint64, uint64) uint16
		}{{"kernel", Addresser.LaneRowHits}, {"go", laneRowHitsGo}} {
			b.Run("table="+itoaKiB(buckets*MaxLanes*8)+"/impl="+k.name, func(b *testing.B) {
				var sink uint16
				i := uint64(0)
				d := make([]time.Duration, 0, 1024)
				for b.Loop() {
					t0 := time.Now()
					for range 64 {
						i++
						sink ^= k.fn(ad, words, benchKeyLike(i))
					}
					d = append(d, time.Since(t0))
				}
				kernelSink += uint64(sink)
				reportP50(b, d, 64)
			})
		}
	}
}

func itoaKiB(n uint64) string {
	if n >= 1<<20 {
		return strconv.FormatUint(n>>20, 10) + "MiB"
	}
	return strconv.FormatUint(n>>10, 10) + "KiB"
}

// BenchmarkSearchPrefix: the search kernel alone on the wasm query
// benchmark's shape (wasm/host BenchmarkQuery by sequence hashes): 1,024
// keys held by all 16 lanes of a 64 MiB table, window 2, so 13 probes
// (gallop to the end, one window probe); p50-ns per search from batches of
// 16. It skips off wasm, where there is no kernel.
func BenchmarkSearchPrefix(b *testing.B) {
	const buckets = 1 << 19
	words := make([]uint64, buckets*MaxLanes)
	ad := NewAddresser(DefaultSeed, buckets)
	rng := rand.New(rand.NewPCG(1, 2))
	seq := make([]uint64, 1024)
	for i := range seq {
		seq[i] = rng.Uint64()
		a := ad.Address(seq[i])
		for l := range MaxLanes {
			w := &words[a.A*MaxLanes+uint64(l)]
			for s := 0; s < 4; s++ {
				if (*w>>(16*s))&0xFFFF == 0 {
					*w |= uint64(a.Fingerprint) << (16 * s)
					break
				}
			}
		}
	}
	s := &PrefixSearch{Seq: seq, Memo: make([]uint16, 1024), Stamp: make([]uint32, 1024), Ready: 0xFFFF, Window: 2, Depth: new([MaxLanes]uint32)}
	d := make([]time.Duration, 0, 4096)
	for b.Loop() {
		t0 := time.Now()
		for range 16 {
			s.Gen++
			if !ad.SearchPrefix(words, s) {
				b.Skip("no kernel")
			}
		}
		d = append(d, time.Since(t0))
	}
	reportP50(b, d, 16)
	require.Equal(b, uint32(1024), s.Depth[15], "depth %d probes %d", s.Depth[15], s.Probes)
	require.Equal(b, 13, s.Probes, "depth %d probes %d", s.Depth[15], s.Probes)
}

// BenchmarkGroupHits: one probe of 16 lanes in 4 format groups × 4 lanes
// (2^10..2^7 buckets, cache-resident; one seed or 4) against LaneRowHits on
// one 16-wide table of 2^10 buckets, over keys that differ every call;
// p50-ns per probe from batches of 64. Natively impl=kernel is the Go path.
func BenchmarkGroupHits(b *testing.B) {
	maps := new([2][256]uint16)
	for v := range 256 {
		maps[0][v] = uint16(v) // identity: slots are lanes (the map's cost is what counts)
	}
	for _, seeds := range []int{1, 4} {
		var s PrefixSearch
		for g := range 4 {
			seed := uint64(DefaultSeed)
			if seeds == 4 {
				seed += uint64(g) * 0x9E3779B97F4A7C15
			}
			buckets := uint64(1<<10) >> g
			words := make([]uint64, buckets*4)
			for i := range words {
				words[i] = benchKeyLike(uint64(i) + uint64(g)<<32)
			}
			s.AddGroup(NewAddresser(seed, buckets), words, 4, maps, 0xF<<(4*g))
		}
		b.Run("layout=mixed4/seeds="+strconv.Itoa(seeds), func(b *testing.B) {
			var sink uint16
			i := uint64(0)
			d := make([]time.Duration, 0, 1024)
			for b.Loop() {
				t0 := time.Now()
				for range 64 {
					i++
					sink ^= s.GroupHits(benchKeyLike(i), 0xFFFF)
				}
				d = append(d, time.Since(t0))
			}
			kernelSink += uint64(sink)
			reportP50(b, d, 64)
		})
	}
	words := make([]uint64, 1<<10*MaxLanes)
	for i := range words {
		words[i] = benchKeyLike(uint64(i))
	}
	ad := NewAddresser(DefaultSeed, 1<<10)
	b.Run("layout=uniform", func(b *testing.B) {
		var sink uint16
		i := uint64(0)
		d := make([]time.Duration, 0, 1024)
		for b.Loop() {
			t0 := time.Now()
			for range 64 {
				i++
				sink ^= ad.LaneRowHits(words, benchKeyLike(i))
			}
			d = append(d, time.Since(t0))
		}
		kernelSink += uint64(sink)
		reportP50(b, d, 64)
	})
}

// BenchmarkSearchGroups: the multi-group search kernel on
// BenchmarkSearchPrefix's shape (1,024 keys held by all 16 lanes, window 2,
// 13 probes, each needing every lane) with the lanes in 4 format groups × 4
// (2^19..2^16 buckets, as wasm/host BenchmarkQueryMixed; one seed or 4),
// beside the one-table kernel, in one run; p50-ns per search from batches
// of 16. It skips off wasm, where there is no kernel.
func BenchmarkSearchGroups(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	seq := make([]uint64, 1024)
	for i := range seq {
		seq[i] = rng.Uint64()
	}
	place := func(words []uint64, width int, ad Addresser, lanes int) {
		for _, k := range seq {
			a := ad.Address(k)
			for l := range lanes {
				w := &words[a.A*uint64(width)+uint64(l)]
				for s := 0; s < 4; s++ {
					if (*w>>(16*s))&0xFFFF == 0 {
						*w |= uint64(a.Fingerprint) << (16 * s)
						break
					}
				}
			}
		}
	}
	run := func(b *testing.B, search func(*PrefixSearch) bool) {
		s := &PrefixSearch{Seq: seq, Memo: make([]uint16, 1024), Stamp: make([]uint32, 1024), Known: make([]uint16, 1024),
			Ready: 0xFFFF, Window: 2, Depth: new([MaxLanes]uint32)}
		d := make([]time.Duration, 0, 4096)
		for b.Loop() {
			t0 := time.Now()
			for range 16 {
				s.Gen += 2
				if !search(s) {
					b.Skip("no kernel")
				}
			}
			d = append(d, time.Since(t0))
		}
		reportP50(b, d, 16)
		require.Equal(b, uint32(1024), s.Depth[15], "depth %d probes %d", s.Depth[15], s.Probes)
		require.Equal(b, 13, s.Probes, "depth %d probes %d", s.Depth[15], s.Probes)
	}
	for _, seeds := range []int{1, 4} {
		var gs PrefixSearch
		for g := range 4 {
			seed := uint64(DefaultSeed)
			if seeds == 4 {
				seed += uint64(g) * 0x9E3779B97F4A7C15
			}
			ad := NewAddresser(seed, 1<<19>>g)
			words := make([]uint64, (1<<19>>g)*4)
			place(words, 4, ad, 4)
			maps := new([2][256]uint16)
			for v := range 16 {
				maps[0][v] = uint16(v) << (4 * g)
			}
			gs.AddGroup(ad, words, 4, maps, 0xF<<(4*g))
		}
		b.Run("layout=mixed4/seeds="+strconv.Itoa(seeds), func(b *testing.B) {
			run(b, func(s *PrefixSearch) bool {
				s.formats, s.runs = gs.formats, gs.runs
				return s.SearchGroups()
			})
		})
	}
	ad := NewAddresser(DefaultSeed, 1<<19)
	words := make([]uint64, (1<<19)*MaxLanes)
	place(words, MaxLanes, ad, MaxLanes)
	b.Run("layout=uniform", func(b *testing.B) {
		run(b, func(s *PrefixSearch) bool { return ad.SearchPrefix(words, s) })
	})
}
