package ckf

import (
	"encoding/binary"
	"slices"

	"github.com/zeebo/xxh3"
)

// BaseSalt is the local block hash seed of the base model (SPEC §3).
const BaseSalt uint64 = 1337

// sequenceSeed seeds the canonical chain hash.
const sequenceSeed uint64 = 1337

// Salt returns the local block hash seed for an adapter and cache namespace:
// 1337, plus (wrapping) XXH3_64(lora, seed 0) when lora is non-empty, plus
// XXH3_64(namespace, seed 1) when namespace is non-empty.
func Salt(lora, namespace string) uint64 {
	s := BaseSalt
	if lora != "" {
		s += xxh3.HashStringSeed(lora, 0)
	}
	if namespace != "" {
		s += xxh3.HashStringSeed(namespace, 1)
	}
	return s
}

// LocalBlockHash returns the tokens_hash of one block: XXH3_64 with seed salt
// over the token ids as little-endian u32s. On little-endian targets the
// tokens are hashed in place, without copying or allocating (hash_le.go).
func LocalBlockHash(tokens []uint32, salt uint64) uint64 {
	return localBlockHash(tokens, salt)
}

// localBlockHashEncoded is the portable path: it encodes the tokens as
// little-endian bytes into a fresh buffer and hashes that. Big-endian targets
// use it; the in-place path is tested against it.
func localBlockHashEncoded(tokens []uint32, salt uint64) uint64 {
	buf := make([]byte, 0, 4*len(tokens))
	for _, tok := range tokens {
		buf = binary.LittleEndian.AppendUint32(buf, tok)
	}
	return xxh3.HashSeed(buf, salt)
}

// AppendLocalBlockHashes appends the local hash of every complete block of
// blockSize tokens to dst and returns it. A trailing partial block is ignored.
// blockSize must be > 0. The whole batch is hashed in one kernel call
// (kernels.go).
func AppendLocalBlockHashes(dst []uint64, tokens []uint32, blockSize int, salt uint64) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	n := len(tokens) / blockSize
	dst = slices.Grow(dst, n)
	hashBlocks(dst[len(dst):len(dst)+n], tokens, blockSize, salt)
	return dst[:len(dst)+n]
}

// AppendTokenSequenceHashes appends the canonical sequence hash of every
// complete block of blockSize tokens to dst and returns it: what
// AppendSequenceHashes of AppendLocalBlockHashes returns, without the
// intermediate slice. A trailing partial block is ignored; blockSize must be
// > 0. Natively one loop hashes and chains each block (the CPU overlaps the
// next block's hash with the chain step); in WebAssembly it runs the two
// batch kernels (kernels.go).
func AppendTokenSequenceHashes(dst []uint64, tokens []uint32, blockSize int, salt uint64) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	n := len(tokens) / blockSize
	dst = slices.Grow(dst, n)
	if n > 0 {
		_ = tokens[n*blockSize-1]
		tokenSequenceArch(dst[len(dst):len(dst)+n], tokens, blockSize, salt)
	}
	return dst[:len(dst)+n]
}

// ChainHash returns the canonical hash of a block whose parent has canonical
// hash parent: XXH3_64(LE8(parent) ‖ LE8(local), seed 1337).
func ChainHash(parent, local uint64) uint64 {
	return xxh3Hash16(parent, local, chainFlipLo, chainFlipHi)
}

// chainFlipLo and chainFlipHi are xxh3Flip16(sequenceSeed), folded at
// compile time.
const (
	chainFlipLo = (xxhSecret64At24 ^ xxhSecret64At32) + sequenceSeed
	chainFlipHi = (xxhSecret64At40 ^ xxhSecret64At48) - sequenceSeed
)

// AppendSequenceHashes appends the canonical chain of locals to dst: s0 =
// locals[0], si = ChainHash(s(i-1), locals[i]). dst may be locals[:0]: the
// chain is then computed in place.
func AppendSequenceHashes(dst []uint64, locals []uint64) []uint64 {
	n := len(dst)
	dst = append(dst, locals...)
	chainInPlace(dst[n:])
	return dst
}
