package ckf

import "testing"

var kernelSink uint64

// BenchmarkKernels compares each batch kernel (impl=kernel) with the
// per-item Go reference it replaces (impl=go) over a 1024-block request of
// 16-token blocks, side by side in one run. Off wasm both are Go; the ratio
// that decides whether a kernel stays is the wasm one (BENCHMARKS.md, "Wasm
// kernels").
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
		{"sequence/impl=kernel", func() { sequenceBlocks(dst, tokens, blockSize, BaseSalt) }},
		{"sequence/impl=twokernels", func() { hashBlocks(dst, tokens, blockSize, BaseSalt); chainInPlace(dst) }},
		{"sequence/impl=go", func() { sequenceBlocksGo(dst, tokens, blockSize, BaseSalt) }},
		{"chain/impl=kernel", func() { chainInPlace(dst) }},
		{"chain/impl=go", func() { chainInPlaceGo(dst) }},
	} {
		b.Run(k.name, func(b *testing.B) {
			for b.Loop() {
				k.fn()
			}
			kernelSink += dst[blocks-1]
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*blocks), "ns/block")
		})
	}
}

// BenchmarkLaneRowHits: one 16-lane probe (address and row test) over keys
// that differ every call, kernel against the Go reference, on a
// cache-resident table (128 KiB) and on a 64 MiB one.
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
				for b.Loop() {
					i++
					sink ^= k.fn(ad, words, benchKeyLike(i))
				}
				kernelSink += uint64(sink)
			})
		}
	}
}

func itoaKiB(n uint64) string {
	if n >= 1<<20 {
		return fmtUint(n>>20) + "MiB"
	}
	return fmtUint(n>>10) + "KiB"
}

func fmtUint(v uint64) string {
	var buf [20]byte
	i := len(buf)
	for {
		i--
		buf[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			return string(buf[i:])
		}
	}
}
