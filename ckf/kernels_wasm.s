// Hand-written WebAssembly kernels for ckf (declared in kernels_wasm.go,
// reference code and rationale in kernels.go). R0..R15 are i64 locals of the
// function; every value stays in them, memory is touched only for input and
// output. Linear-memory addresses are i64 in Go and wrapped to i32 for loads.

#include "textflag.h"

// FOLD leaves hi ^ lo of the 128-bit product R11 × R12 on the stack (XXH3's
// mul128_fold64). lo is the plain i64.mul; hi comes from three more 32×32→64
// multiplies: with ll = aL·bL, lh = aL·bH, hl = aH·bL, hh = aH·bH,
//   cross = hl + (ll >> 32) + (lh & M)        (cannot overflow)
//   hi    = hh + (lh >> 32) + (cross >> 32)
// It uses R13 and leaves R11, R12 intact.
#define FOLD \
	Get R11; Get R12; I64Mul; \
	Get R11; I64Const $0xffffffff; I64And; Get R12; I64Const $32; I64ShrU; I64Mul; Set R13; \
	Get R11; I64Const $32; I64ShrU; Get R12; I64Const $0xffffffff; I64And; I64Mul; \
	Get R11; I64Const $0xffffffff; I64And; Get R12; I64Const $0xffffffff; I64And; I64Mul; I64Const $32; I64ShrU; I64Add; \
	Get R13; I64Const $0xffffffff; I64And; I64Add; I64Const $32; I64ShrU; \
	Get R13; I64Const $32; I64ShrU; I64Add; \
	Get R11; I64Const $32; I64ShrU; Get R12; I64Const $32; I64ShrU; I64Mul; I64Add; \
	I64Xor

// MIX16 adds mix16B(input at P, keys at R10+K) to the accumulator R6.
#define MIX16(P, K) \
	Get P; I32WrapI64; I64Load $0; Get R10; I32WrapI64; I64Load $(K); I64Xor; Set R11; \
	Get P; I32WrapI64; I64Load $8; Get R10; I32WrapI64; I64Load $(K+8); I64Xor; Set R12; \
	FOLD; Get R6; I64Add; Set R6

// XXH3_AVALANCHE replaces the stack top h with h ^= h >> 37; h *= M; h ^ h >> 32.
// It uses R13.
#define XXH3_AVALANCHE \
	Tee R13; Get R13; I64Const $37; I64ShrU; I64Xor; \
	I64Const $0x165667919E3779F9; I64Mul; \
	Tee R13; Get R13; I64Const $32; I64ShrU; I64Xor

// HASH17TO128 pushes XXH3-64 of the R3 (17..128) bytes at R2, with the
// keys block at R4 (see blockKeys in kernels_wasm.go: words 0..15 the seeded
// secret, 16 = length × PRIME64_1, 17 = rounds). Round r adds
// mix16B(src + 16r, key 32r) and mix16B(src + length - 16(r+1), key 32r+16):
// XXH3's 17..128-byte path with its nested length tests as a loop. It uses
// R6..R13.
#define HASH17TO128 \
	Get R4; I32WrapI64; I64Load $128; Set R6; \
	Get R4; I32WrapI64; I64Load $136; Set R7; \
	Get R2; Set R8; \
	Get R2; Get R3; I64Add; I64Const $16; I64Sub; Set R9; \
	Get R4; Set R10; \
	Loop; \
		MIX16(R8, 0); MIX16(R9, 16); \
		Get R8; I64Const $16; I64Add; Set R8; \
		Get R9; I64Const $16; I64Sub; Set R9; \
		Get R10; I64Const $32; I64Add; Set R10; \
		Get R7; I64Const $1; I64Sub; Tee R7; I64Eqz; I32Eqz; BrIf $0; \
	End; \
	Get R6; XXH3_AVALANCHE

// BSWAP64 pushes R's bytes reversed (no wasm instruction: two mask-and-shift
// swaps and a 32-bit rotation). It uses R13.
#define BSWAP64(R) \
	Get R; I64Const $8; I64ShrU; I64Const $0x00FF00FF00FF00FF; I64And; \
	Get R; I64Const $0x00FF00FF00FF00FF; I64And; I64Const $8; I64Shl; I64Or; Set R13; \
	Get R13; I64Const $16; I64ShrU; I64Const $0x0000FFFF0000FFFF; I64And; \
	Get R13; I64Const $0x0000FFFF0000FFFF; I64And; I64Const $16; I64Shl; I64Or; \
	I64Const $32; I64Rotl

// CHAIN replaces the stack top (a local hash) with XXH3-64 of
// LE8(PREV) ‖ LE8(local) given the seed terms LO, HI (xxh3Hash16): with
// a = PREV ^ LO, b = local ^ HI, avalanche(16 + bswap64(a) + b + fold(a, b)).
// It uses R11..R13.
#define CHAIN(PREV, LO, HI) \
	Get HI; I64Xor; Set R12; \
	Get PREV; Get LO; I64Xor; Set R11; \
	FOLD; BSWAP64(R11); I64Add; Get R12; I64Add; I64Const $16; I64Add; \
	XXH3_AVALANCHE

// func xxh3Blocks17to128(dst *uint64, n int, src *byte, length int, keys *[18]uint64)
TEXT ·xxh3Blocks17to128(SB), NOSPLIT, $0-40
	I64Load dst+0(FP)
	Set R0
	I64Load n+8(FP)
	Set R1
	I64Load src+16(FP)
	Set R2
	I64Load length+24(FP)
	Set R3
	I64Load keys+32(FP)
	Set R4
	Block
		Get R1
		I64Eqz
		BrIf $0
		Loop
			Get R0
			I32WrapI64
			HASH17TO128
			I64Store $0
			Get R0
			I64Const $8
			I64Add
			Set R0
			Get R2
			Get R3
			I64Add
			Set R2
			Get R1
			I64Const $1
			I64Sub
			Tee R1
			I64Eqz
			I32Eqz
			BrIf $0
		End
	End
	RET

// FOLDR is FOLD with the 32-bit halves computed once into R3..R6
// (aL, aH, bL, bH): 18 instructions instead of 21. For kernels that keep
// their keys in f64 locals and so have R3..R6 free. It uses R3..R6, R13.
#define FOLDR \
	Get R11; Get R12; I64Mul; \
	Get R11; I64Const $0xffffffff; I64And; Set R3; Get R11; I64Const $32; I64ShrU; Set R4; \
	Get R12; I64Const $0xffffffff; I64And; Set R5; Get R12; I64Const $32; I64ShrU; Set R6; \
	Get R3; Get R6; I64Mul; Set R13; \
	Get R4; Get R5; I64Mul; \
	Get R3; Get R5; I64Mul; I64Const $32; I64ShrU; I64Add; \
	Get R13; I64Const $0xffffffff; I64And; I64Add; I64Const $32; I64ShrU; \
	Get R13; I64Const $32; I64ShrU; I64Add; \
	Get R4; Get R6; I64Mul; I64Add; \
	I64Xor

// MIX16K adds mix16B(input at R2+OFF, keys KA, KB held in f64 locals as
// raw bits) to the accumulator R14.
#define MIX16K(OFF, KA, KB) \
	Get R2; I32WrapI64; I64Load $(OFF); Get KA; I64ReinterpretF64; I64Xor; Set R11; \
	Get R2; I32WrapI64; I64Load $(OFF+8); Get KB; I64ReinterpretF64; I64Xor; Set R12; \
	FOLDR; Get R14; I64Add; Set R14

// HASH64 pushes XXH3-64 of the 64 bytes at R2 (16 tokens, the default
// block), unrolled, with the seeded secret's words 0..7 in F16..F23:
// acc = 64 × PRIME64_1, then mix16B of bytes 0, 48 (keys 0..3) and 16, 32
// (keys 4..7). It uses R3..R6, R11..R14.
#define HASH64 \
	I64Const $0x8dde6c617af2a1c0; Set R14; \
	MIX16K(0, F16, F17); MIX16K(48, F18, F19); MIX16K(16, F20, F21); MIX16K(32, F22, F23); \
	Get R14; XXH3_AVALANCHE

// LOADKEYS64 loads the seeded secret's words 0..7 from keys (R15 at entry)
// into F16..F23, as raw bits: the kernel's i64 locals are all taken.
#define LOADKEYS64 \
	Get R15; I32WrapI64; F64Load $0; Set F16; Get R15; I32WrapI64; F64Load $8; Set F17; \
	Get R15; I32WrapI64; F64Load $16; Set F18; Get R15; I32WrapI64; F64Load $24; Set F19; \
	Get R15; I32WrapI64; F64Load $32; Set F20; Get R15; I32WrapI64; F64Load $40; Set F21; \
	Get R15; I32WrapI64; F64Load $48; Set F22; Get R15; I32WrapI64; F64Load $56; Set F23

// CHAINK is CHAIN with the canonical chain hash's seed terms as constants:
// chainFlipLo = 0x6782737bea423ef2, chainFlipHi = 0xaf56bc3b09964d01
// (sequence seed 1337; kernels_test checks them through the results).
#define CHAINK(PREV) \
	I64Const $0xaf56bc3b09964d01; I64Xor; Set R12; \
	Get PREV; I64Const $0x6782737bea423ef2; I64Xor; Set R11; \
	FOLDR; BSWAP64(R11); I64Add; Get R12; I64Add; I64Const $16; I64Add; \
	XXH3_AVALANCHE

// func seqBlocks64(dst *uint64, n int, src *byte, keys *[18]uint64)
//
// The canonical chain of n ≥ 1 blocks of 64 bytes in one pass: dst[0] is
// block 0's hash, dst[i] = CHAINK(dst[i-1], hash of block i). Block i+1's
// hash does not depend on the chain, so the CPU overlaps it with chain
// step i.
TEXT ·seqBlocks64(SB), NOSPLIT, $0-32
	I64Load dst+0(FP)
	Set R0
	I64Load n+8(FP)
	Set R1
	I64Load src+16(FP)
	Set R2
	I64Load keys+24(FP)
	Set R15
	LOADKEYS64
	Get R0
	I32WrapI64
	HASH64
	Tee R15
	I64Store $0
	Block
		Loop
			Get R1
			I64Const $1
			I64Sub
			Tee R1
			I64Eqz
			BrIf $1
			Get R0
			I64Const $8
			I64Add
			Set R0
			Get R2
			I64Const $64
			I64Add
			Set R2
			Get R0
			I32WrapI64
			HASH64
			CHAINK(R15)
			Tee R15
			I64Store $0
			Br $0
		End
	End
	RET

// func chainWords(h *uint64, n int, lo, hi uint64)
//
// h[i] = CHAIN(h[i-1], h[i]) for 1 ≤ i < n, in place.
TEXT ·chainWords(SB), NOSPLIT, $0-32
	I64Load h+0(FP)
	Set R0
	I64Load n+8(FP)
	Set R1
	I64Load lo+16(FP)
	Set R2
	I64Load hi+24(FP)
	Set R3
	Block
		Get R1
		I64Const $2
		I64LtS
		BrIf $0
		Get R0
		I32WrapI64
		I64Load $0
		Set R6
		Loop
			Get R0
			I64Const $8
			I64Add
			Set R0
			Get R0
			I32WrapI64
			Get R0
			I32WrapI64
			I64Load $0
			CHAIN(R6, R2, R3)
			Tee R6
			I64Store $0
			Get R1
			I64Const $1
			I64Sub
			Tee R1
			I64Const $1
			I64GtS
			BrIf $0
		End
	End
	RET

// LANE tests lane word OFF/8 of rows R7 (bucket a) and R8 (bucket b) against
// the broadcast fingerprint R6 and ORs bit OFF/8 into R9 on a match:
// x has a zero 16-bit lane iff (x - 0x0001…) & ^x & 0x8000… ≠ 0.
#define LANE(OFF, BIT) \
	Get R7; I32WrapI64; I64Load $(OFF); Get R6; I64Xor; Tee R10; I64Const $0x0001000100010001; I64Sub; \
	Get R10; I64Const $-1; I64Xor; I64And; \
	Get R8; I32WrapI64; I64Load $(OFF); Get R6; I64Xor; Tee R10; I64Const $0x0001000100010001; I64Sub; \
	Get R10; I64Const $-1; I64Xor; I64And; \
	I64Or; I64Const $0x8000800080008000; I64And; I64Const $0; I64Ne; I64ExtendI32U; \
	I64Const $(BIT); I64Shl; Get R9; I64Or; Set R9

// func laneRowHits(words *uint64, key, keyFlip, dispFlip, mask uint64) uint64
TEXT ·laneRowHits(SB), NOSPLIT, $0-48
	I64Load words+0(FP)
	Set R0
	I64Load key+8(FP)
	Set R1
	I64Load keyFlip+16(FP)
	Set R2
	I64Load dispFlip+24(FP)
	Set R3
	I64Load mask+32(FP)
	Set R4

	// m = xxh3Hash8(key, keyFlip): rotate, flip, rrmxmx.
	Get R1
	I64Const $32
	I64Rotl
	Get R2
	I64Xor
	Tee R5
	Get R5
	I64Const $49
	I64Rotl
	I64Xor
	Get R5
	I64Const $24
	I64Rotl
	I64Xor
	I64Const $0x9FB21C651E98DF25
	I64Mul
	Tee R5
	Get R5
	I64Const $35
	I64ShrU
	I64Const $8
	I64Add
	I64Xor
	I64Const $0x9FB21C651E98DF25
	I64Mul
	Tee R5
	Get R5
	I64Const $28
	I64ShrU
	I64Xor
	Set R5

	// R6 = fp = m & 0xFFFF, or 1 when that is 0; R7 = a = (m >> 16) & mask
	Get R5
	I64Const $0xFFFF
	I64And
	Tee R6
	Get R6
	I64Eqz
	I64ExtendI32U
	I64Or
	Set R6
	Get R5
	I64Const $16
	I64ShrU
	Get R4
	I64And
	Set R7

	// d = xxh3Hash2(fp, dispFlip) & mask, or 1 when 0; R8 = b = a ^ d
	Get R6
	I64Const $0xFF
	I64And
	I64Const $16
	I64Shl
	Get R6
	I64Const $8
	I64ShrU
	Tee R8
	I64Const $24
	I64Shl
	I64Or
	Get R8
	I64Or
	I64Const $0x200
	I64Or
	Get R3
	I64Xor
	Tee R8
	Get R8
	I64Const $33
	I64ShrU
	I64Xor
	I64Const $0xC2B2AE3D27D4EB4F
	I64Mul
	Tee R8
	Get R8
	I64Const $29
	I64ShrU
	I64Xor
	I64Const $0x165667B19E3779F9
	I64Mul
	Tee R8
	Get R8
	I64Const $32
	I64ShrU
	I64Xor
	Get R4
	I64And
	Tee R8
	Get R8
	I64Eqz
	I64ExtendI32U
	I64Or
	Get R7
	I64Xor
	Set R8

	// Row addresses (16 words of 8 bytes per bucket) and the broadcast fp.
	Get R7
	I64Const $7
	I64Shl
	Get R0
	I64Add
	Set R7
	Get R8
	I64Const $7
	I64Shl
	Get R0
	I64Add
	Set R8
	Get R6
	I64Const $0x0001000100010001
	I64Mul
	Set R6

	I64Const $0
	Set R9
	LANE(0, 0)
	LANE(8, 1)
	LANE(16, 2)
	LANE(24, 3)
	LANE(32, 4)
	LANE(40, 5)
	LANE(48, 6)
	LANE(56, 7)
	LANE(64, 8)
	LANE(72, 9)
	LANE(80, 10)
	LANE(88, 11)
	LANE(96, 12)
	LANE(104, 13)
	LANE(112, 14)
	LANE(120, 15)

	Get SP
	Get R9
	I64Store ret+40(FP)
	RET
