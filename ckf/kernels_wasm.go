package ckf

import "unsafe"

// Declarations of the WebAssembly kernels in kernels_wasm.s. Pointers are
// linear-memory addresses; the Go callers check every bound first.

// xxh3Blocks17to128 writes XXH3-64 of n consecutive blocks of length bytes
// (17 ≤ length ≤ 128) starting at src to dst[0..n), with keys =
// blockKeys(seed, length).
//
//go:noescape
func xxh3Blocks17to128(dst *uint64, n int, src *byte, length int, keys *[18]uint64)

// blockKeys lays out what xxh3Blocks17to128 reads per call: the seeded
// secret (words 0..15), length × PRIME64_1 (16) and the number of 32-byte
// rounds (17).
func blockKeys(seed uint64, length int) (k [18]uint64) {
	s := xxh3Keys17to128(seed)
	copy(k[:], s[:])
	k[16] = uint64(length) * 0x9E3779B185EBCA87
	k[17] = uint64(length-1)/32 + 1
	return k
}

// seqBlocks64 hashes n ≥ 1 blocks of 64 bytes and chains them in the same
// pass: dst[0] is block 0's hash, dst[i] = ChainHash(dst[i-1], hash of
// block i). The chain seed terms are constants in the kernel.
//
//go:noescape
func seqBlocks64(dst *uint64, n int, src *byte, keys *[18]uint64)

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
	keys := blockKeys(salt, length)
	src := (*byte)(unsafe.Pointer(unsafe.SliceData(tokens)))
	xxh3Blocks17to128(unsafe.SliceData(dst), len(dst), src, length, &keys)
}

// tokenSequenceArch runs seqBlocks64 for 16-token blocks (the default) and
// the two batch kernels otherwise (BENCHMARKS.md, "Wasm kernels").
func tokenSequenceArch(dst []uint64, tokens []uint32, blockSize int, salt uint64) {
	if blockSize == 16 && useSeq64 {
		keys := blockKeys(salt, 64)
		seqBlocks64(unsafe.SliceData(dst), len(dst), (*byte)(unsafe.Pointer(unsafe.SliceData(tokens))), &keys)
		return
	}
	hashBlocksArch(dst, tokens, blockSize, salt)
	if len(dst) > 1 {
		chainInPlaceArch(dst)
	}
}

func chainInPlaceArch(h []uint64) {
	chainWords(unsafe.SliceData(h), len(h), chainFlipLo, chainFlipHi)
}

// laneRowHits is LaneRowHits for rows at words (bucketCount = mask+1 rows of
// 16 words, checked by the caller): the addressing of xxh3small.go, then
// the SWAR zero-lane test of Bucket.Contains on all 32 words, branch-free.
//
//go:noescape
func laneRowHits(words *uint64, key, keyFlip, dispFlip, mask uint64) uint64

func laneRowHitsArch(ad Addresser, words []uint64, key uint64) uint16 {
	return uint16(laneRowHits(unsafe.SliceData(words), key, ad.keyFlip, ad.dispFlip, ad.mask))
}

// prefixSearch runs s (PrefixSearch's fields at go_asm.h's offsets) on the
// table at words (nwords words) with the addressing's keyFlip, dispFlip and
// mask, and reports true; it reports false, doing nothing, when s or the
// table breaks SearchPrefix's contract.
//
//go:noescape
func prefixSearch(s *PrefixSearch, keyFlip, dispFlip, mask uint64, words *uint64, nwords int) bool

func searchPrefixArch(keyFlip, dispFlip, mask uint64, words []uint64, s *PrefixSearch) bool {
	return prefixSearch(s, keyFlip, dispFlip, mask, unsafe.SliceData(words), len(words))
}

// groupHits is GroupProbe for the n ≥ 1 groups at gs (hits in bits 0..15,
// covered in 16..31): GROUPLOOP of kernels_wasm.s, the probe
// prefixSearchGroups inlines.
//
//go:noescape
func groupHits(gs *searchGroup, n int, key, want uint64) uint64

func groupHitsArch(gs []searchGroup, key uint64, want uint16) (hits, covered uint16) {
	r := groupHits(unsafe.SliceData(gs), len(gs), key, uint64(want))
	return uint16(r), uint16(r >> 16)
}

// prefixSearchGroups is prefixSearch with GroupProbe as its probe, over the
// groups in s.formats, reading at each position only the groups of the
// lanes the search needs there (s.Known keeps the lanes each position
// answered); it reports false, doing nothing, when s breaks SearchPrefix's
// contract, Known is shorter than Seq or s has no group.
//
//go:noescape
func prefixSearchGroups(s *PrefixSearch) bool

func searchGroupsArch(s *PrefixSearch) bool {
	if s.runs > 1 {
		return prefixSearchRuns(s)
	}
	return prefixSearchGroups(s)
}

// prefixSearchRuns is prefixSearchGroups with the key hash of the next run
// of same-seed groups computed while a group's rows load (GROUPLOOPP), for
// groups of several seeds; same contract and results.
//
//go:noescape
func prefixSearchRuns(s *PrefixSearch) bool
