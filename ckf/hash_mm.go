package ckf

import (
	"encoding/binary"
	"slices"

	"github.com/zeebo/xxh3"
)

// LocalBlockHashMM returns the tokens_hash of a block holding multimodal
// content: XXH3_64 with seed salt over the token ids as little-endian u32s
// followed by the block's multimodal hashes, sorted ascending, as
// little-endian u64s (Dynamo's compute_block_hash_for_seq,
// lib/kv-router/src/protocols.rs). With no mm hashes it equals
// [LocalBlockHash]. mm is not modified.
func LocalBlockHashMM(tokens []uint32, mm []uint64, salt uint64) uint64 {
	if len(mm) == 0 {
		return LocalBlockHash(tokens, salt)
	}
	var stack [64]uint64
	sorted := append(stack[:0], mm...)
	slices.Sort(sorted)
	buf := make([]byte, 0, 4*len(tokens)+8*len(sorted))
	for _, t := range tokens {
		buf = binary.LittleEndian.AppendUint32(buf, t)
	}
	for _, h := range sorted {
		buf = binary.LittleEndian.AppendUint64(buf, h)
	}
	return xxh3.HashSeed(buf, salt)
}

// Multimodal pad values (Dynamo protocols.rs pad_value_for_mm_hash, after
// SGLang's MultimodalItem pad value): a run of image placeholder tokens is
// replaced by PadValue(mm_hash) when a model's image_token_id is configured.
const (
	mmPadShift = 1_000_000
	mmPadMask  = 1<<30 - 1
)

// PadValue returns the token that stands for the multimodal object mmHash:
// 1,000,000 + (mmHash & (2^30 − 1)).
func PadValue(mmHash uint64) uint32 { return uint32(mmPadShift + mmHash&mmPadMask) }

// HashOptions are the per-request inputs of the block hash beyond the tokens
// and the salt: per-block multimodal hashes (MM[i] for block i; nil or short
// for none) and Eagle windows (block i hashes tokens[i·bs : (i+1)·bs + 1]).
type HashOptions struct {
	MM    [][]uint64
	Eagle bool
}

// BlockCount returns how many complete blocks tokens holds: len/bs, or
// (len−1)/bs with Eagle windows.
func BlockCount(nTokens, blockSize int, eagle bool) int {
	if blockSize <= 0 || nTokens <= 0 {
		return 0
	}
	if eagle {
		return (nTokens - 1) / blockSize
	}
	return nTokens / blockSize
}

// AppendTokenSequenceHashesWith is [AppendTokenSequenceHashes] with
// multimodal hashes and Eagle windows: the canonical sequence hash of every
// complete block, each local hash from [LocalBlockHashMM] over the block's
// window. With zero options it equals AppendTokenSequenceHashes.
func AppendTokenSequenceHashesWith(dst []uint64, tokens []uint32, blockSize int, salt uint64, o HashOptions) []uint64 {
	if len(o.MM) == 0 && !o.Eagle {
		return AppendTokenSequenceHashes(dst, tokens, blockSize, salt)
	}
	n := BlockCount(len(tokens), blockSize, o.Eagle)
	w := blockSize
	if o.Eagle {
		w++
	}
	start := len(dst)
	for i := range n {
		var mm []uint64
		if i < len(o.MM) {
			mm = o.MM[i]
		}
		local := LocalBlockHashMM(tokens[i*blockSize:i*blockSize+w], mm, salt)
		if i > 0 {
			local = ChainHash(dst[start+i-1], local)
		}
		dst = append(dst, local)
	}
	return dst
}
