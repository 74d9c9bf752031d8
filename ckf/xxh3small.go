package ckf

import "math/bits"

// Specialised XXH3-64 for the fixed input sizes ckf hashes: an 8-byte key and
// a 2-byte fingerprint in addressing (SPEC §2.2), and the 16-byte parent ‖
// local pair of the chain hash (SPEC §3), all little-endian. They return
// exactly what xxh3.HashSeed returns for those inputs (a property test checks
// every 2-byte input and random 8-byte inputs against it), but take the
// value instead of a slice and split the work into a per-seed part, computed
// once by [NewAddresser], and a per-input part. That skips the generic
// length dispatch, the byte encoding and the seed mixing on every call, and
// needs no 128-bit multiply for the two addressing sizes, which matters most in
// WebAssembly.
//
// The constants are words of the XXH3 default secret ("kSecret" in the XXH3
// specification), read little-endian at the byte offset in their name.
const (
	xxhSecret32At0  uint64 = 0xbe4ba423
	xxhSecret32At4  uint64 = 0x396cfeb8
	xxhSecret64At8  uint64 = 0x1cad21f72c81017c
	xxhSecret64At16 uint64 = 0xdb979083e96dd4de
	xxhSecret64At24 uint64 = 0x1f67b3b7a4a44072
	xxhSecret64At32 uint64 = 0x78e5c0cc4ee679cb
	xxhSecret64At40 uint64 = 0x2172ffcc7dd05a82
	xxhSecret64At48 uint64 = 0x8e2443f7744608b8

	xxhPrime64_2 uint64 = 0xC2B2AE3D27D4EB4F
	xxhPrime64_3 uint64 = 0x165667B19E3779F9
	rrmxmxMul    uint64 = 0x9FB21C651E98DF25
	xxh3AvalMul  uint64 = 0x165667919E3779F9
)

// xxh3Flip8 is the per-seed term of the 4..8-byte XXH3 path: the secret's
// bitflip minus the seed with its low half byte-swapped into its high half.
func xxh3Flip8(seed uint64) uint64 {
	seed ^= uint64(bits.ReverseBytes32(uint32(seed))) << 32
	return (xxhSecret64At8 ^ xxhSecret64At16) - seed
}

// xxh3Hash8 is XXH3-64 of the 8 little-endian bytes of v, given
// flip = xxh3Flip8(seed).
func xxh3Hash8(v, flip uint64) uint64 {
	// The 4..8-byte path reads the first and last four bytes and puts the
	// first in the high half: for exactly 8 bytes that is a 32-bit rotation.
	h := bits.RotateLeft64(v, 32) ^ flip
	// rrmxmx finaliser, with the input length 8.
	h ^= bits.RotateLeft64(h, 49) ^ bits.RotateLeft64(h, 24)
	h *= rrmxmxMul
	h ^= (h >> 35) + 8
	h *= rrmxmxMul
	return h ^ h>>28
}

// xxh3Flip2 is the per-seed term of the 1..3-byte XXH3 path.
func xxh3Flip2(seed uint64) uint64 { return (xxhSecret32At0 ^ xxhSecret32At4) + seed }

// xxh3Hash2 is XXH3-64 of the 2 little-endian bytes of v, given
// flip = xxh3Flip2(seed).
func xxh3Hash2(v uint16, flip uint64) uint64 {
	// The 1..3-byte path combines first byte << 16, middle byte << 24, last
	// byte and length << 8; for two bytes middle and last are both byte 1.
	lo, hi := uint64(v&0xFF), uint64(v>>8)
	h := (lo<<16 | hi<<24 | hi | 2<<8) ^ flip
	// XXH64 avalanche.
	h ^= h >> 33
	h *= xxhPrime64_2
	h ^= h >> 29
	h *= xxhPrime64_3
	return h ^ h>>32
}

// xxh3Flip16 is the per-seed pair of terms of the 9..16-byte XXH3 path.
func xxh3Flip16(seed uint64) (lo, hi uint64) {
	return (xxhSecret64At24 ^ xxhSecret64At32) + seed, (xxhSecret64At40 ^ xxhSecret64At48) - seed
}

// xxh3Hash16 is XXH3-64 of LE8(first) ‖ LE8(last), given
// lo, hi = xxh3Flip16(seed).
func xxh3Hash16(first, last, lo, hi uint64) uint64 {
	// The 9..16-byte path reads the first and the last eight bytes: for
	// exactly 16 bytes, the two words.
	inLo, inHi := first^lo, last^hi
	mulHi, mulLo := bits.Mul64(inLo, inHi)
	h := 16 + bits.ReverseBytes64(inLo) + inHi + (mulHi ^ mulLo)
	// XXH3 avalanche.
	h ^= h >> 37
	h *= xxh3AvalMul
	return h ^ h>>32
}
