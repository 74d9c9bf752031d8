package ckf

import "unsafe"

// Declarations of the WebAssembly kernels in kernels_wasm.s. Pointers are
// linear-memory addresses; the Go callers check every bound first.

// xxh3Blocks17to128 writes XXH3-64 of n consecutive blocks of length bytes
// (17 ≤ length ≤ 128) starting at src to dst[0..n), with keys =
// xxh3Keys17to128(seed).
//
//go:noescape
func xxh3Blocks17to128(dst *uint64, n int, src *byte, length int, keys *[16]uint64)

// chainWords sets h[i] = xxh3Hash16(h[i-1], h[i], lo, hi) for 1 ≤ i < n.
//
//go:noescape
func chainWords(h *uint64, n int, lo, hi uint64)

func hashBlocksArch(dst []uint64, tokens []uint32, blockSize int, salt uint64) {
	length := 4 * blockSize
	if length < 17 || length > 128 {
		hashBlocksGo(dst, tokens, blockSize, salt)
		return
	}
	keys := xxh3Keys17to128(salt)
	src := (*byte)(unsafe.Pointer(unsafe.SliceData(tokens)))
	xxh3Blocks17to128(unsafe.SliceData(dst), len(dst), src, length, &keys)
}

func chainInPlaceArch(h []uint64) {
	chainWords(unsafe.SliceData(h), len(h), chainFlipLo, chainFlipHi)
}
