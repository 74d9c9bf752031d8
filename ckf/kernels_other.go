//go:build !wasm

package ckf

// Off WebAssembly the kernels are the Go reference code: the compiler already
// keeps it in registers and has a 128-bit multiply.

func hashBlocksArch(dst []uint64, tokens []uint32, blockSize int, salt uint64) {
	hashBlocksGo(dst, tokens, blockSize, salt)
}

func tokenSequenceArch(dst []uint64, tokens []uint32, blockSize int, salt uint64) {
	tokenSequenceGo(dst, tokens, blockSize, salt)
}

func chainInPlaceArch(h []uint64) { chainInPlaceGo(h) }

func laneRowHitsArch(ad Addresser, words []uint64, key uint64) uint16 {
	return laneRowHitsGo(ad, words, key)
}

func searchPrefixArch(uint64, uint64, uint64, []uint64, *PrefixSearch) bool { return false }

func groupHitsArch(gs []searchGroup, key uint64, want uint16) (hits, covered uint16) {
	return groupHitsGo(gs, key, want)
}

func searchGroupsArch(*PrefixSearch) bool { return false }
