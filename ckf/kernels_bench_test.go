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
