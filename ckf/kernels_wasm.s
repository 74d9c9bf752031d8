// Hand-written WebAssembly kernels for ckf (declared in kernels_wasm.go,
// reference code and rationale in kernels.go). R0..R15 are i64 locals of the
// function; every value stays in them, memory is touched only for input and
// output. Linear-memory addresses are i64 in Go and wrapped to i32 for loads.

#include "go_asm.h"
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
// the broadcast fingerprint R6 and ORs the result into R9: x = word ^ R6 has a
// zero 16-bit lane iff (x - 0x0001…) & ^x & 0x8000… ≠ 0, with ^x computed as
// word ^ R5 (R5 = ^R6), one operation fewer than x ^ -1; those high bits,
// shifted right by 15 - OFF/8, land on bits OFF/8 + 16k, distinct for every
// lane; ROWHITS folds the four 16-bit groups once at the end (two fewer
// operations per lane than a compare and shift per lane).
#define LANE(OFF, BIT) \
	Get R7; I32WrapI64; I64Load $(OFF); Tee R10; Get R6; I64Xor; I64Const $0x0001000100010001; I64Sub; \
	Get R10; Get R5; I64Xor; I64And; \
	Get R8; I32WrapI64; I64Load $(OFF); Tee R10; Get R6; I64Xor; I64Const $0x0001000100010001; I64Sub; \
	Get R10; Get R5; I64Xor; I64And; \
	I64Or; I64Const $0x8000800080008000; I64And; I64Const $(15-BIT); I64ShrU; Get R9; I64Or; Set R9

// ROWHITS sets R9 to the lane hit mask of key R1 (the body of laneRowHits):
// table at R0, keyFlip R2, dispFlip R3, mask R4. It uses R5..R10 and keeps
// R0..R4 and R11..R15.
#define ROWHITS \
	Get R1; \
	I64Const $32; \
	I64Rotl; \
	Get R2; \
	I64Xor; \
	Tee R5; \
	Get R5; \
	I64Const $49; \
	I64Rotl; \
	I64Xor; \
	Get R5; \
	I64Const $24; \
	I64Rotl; \
	I64Xor; \
	I64Const $0x9FB21C651E98DF25; \
	I64Mul; \
	Tee R5; \
	Get R5; \
	I64Const $35; \
	I64ShrU; \
	I64Const $8; \
	I64Add; \
	I64Xor; \
	I64Const $0x9FB21C651E98DF25; \
	I64Mul; \
	Tee R5; \
	Get R5; \
	I64Const $28; \
	I64ShrU; \
	I64Xor; \
	Set R5; \
	Get R5; \
	I64Const $0xFFFF; \
	I64And; \
	Tee R6; \
	Get R6; \
	I64Eqz; \
	I64ExtendI32U; \
	I64Or; \
	Set R6; \
	Get R5; \
	I64Const $16; \
	I64ShrU; \
	Get R4; \
	I64And; \
	Set R7; \
	Get R6; \
	I64Const $0xFF; \
	I64And; \
	I64Const $16; \
	I64Shl; \
	Get R6; \
	I64Const $8; \
	I64ShrU; \
	Tee R8; \
	I64Const $24; \
	I64Shl; \
	I64Or; \
	Get R8; \
	I64Or; \
	I64Const $0x200; \
	I64Or; \
	Get R3; \
	I64Xor; \
	Tee R8; \
	Get R8; \
	I64Const $33; \
	I64ShrU; \
	I64Xor; \
	I64Const $0xC2B2AE3D27D4EB4F; \
	I64Mul; \
	Tee R8; \
	Get R8; \
	I64Const $29; \
	I64ShrU; \
	I64Xor; \
	I64Const $0x165667B19E3779F9; \
	I64Mul; \
	Tee R8; \
	Get R8; \
	I64Const $32; \
	I64ShrU; \
	I64Xor; \
	Get R4; \
	I64And; \
	Tee R8; \
	Get R8; \
	I64Eqz; \
	I64ExtendI32U; \
	I64Or; \
	Get R7; \
	I64Xor; \
	Set R8; \
	Get R7; \
	I64Const $7; \
	I64Shl; \
	Get R0; \
	I64Add; \
	Set R7; \
	Get R8; \
	I64Const $7; \
	I64Shl; \
	Get R0; \
	I64Add; \
	Set R8; \
	Get R6; \
	I64Const $0x0001000100010001; \
	I64Mul; \
	Tee R6; \
	I64Const $-1; \
	I64Xor; \
	Set R5; \
	I64Const $0; \
	Set R9; \
	LANE(0, 0); \
	LANE(8, 1); \
	LANE(16, 2); \
	LANE(24, 3); \
	LANE(32, 4); \
	LANE(40, 5); \
	LANE(48, 6); \
	LANE(56, 7); \
	LANE(64, 8); \
	LANE(72, 9); \
	LANE(80, 10); \
	LANE(88, 11); \
	LANE(96, 12); \
	LANE(104, 13); \
	LANE(112, 14); \
	LANE(120, 15); \
	Get R9; Get R9; I64Const $32; I64ShrU; I64Or; Tee R9; \
	Get R9; I64Const $16; I64ShrU; I64Or; I64Const $0xFFFF; I64And; Set R9

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
	ROWHITS
	Get SP
	Get R9
	I64Store ret+40(FP)
	RET

// Prefix search (prefixSearch): the PrefixSearch at R11 (field offsets from
// go_asm.h). R0, R2..R4 hold the probe constants, R12 the position probed,
// R13..R15 the search state; ROWHITS uses R1 and R5..R10.
#define S_SEQ $PrefixSearch_Seq
#define S_N $(PrefixSearch_Seq+8)
#define S_MEMO $PrefixSearch_Memo
#define S_MEMOLEN $(PrefixSearch_Memo+8)
#define S_STAMPLEN $(PrefixSearch_Stamp+8)
#define S_STAMP $PrefixSearch_Stamp
#define S_GEN $PrefixSearch_Gen
#define S_READY $PrefixSearch_Ready
#define S_WINDOW $PrefixSearch_Window
#define S_DEPTH $PrefixSearch_Depth
#define S_LO $PrefixSearch_Lo
#define S_STACK $PrefixSearch_stack
#define S_PROBES $PrefixSearch_Probes
#define S_FALLBACK $PrefixSearch_Fallback
#define S_RESUME $PrefixSearch_Resume
#define S_ARG $PrefixSearch_arg
#define S_T $PrefixSearch_T
#define S_SP $PrefixSearch_sp
#define S_GROUPS $PrefixSearch_groups
#define S_LEFT $PrefixSearch_Left

// LOADS pushes the state field at OFF.
#define LOADS(OFF) Get R11; I32WrapI64; I64Load OFF
// STORES stores the stack top (pushed by the instructions V) into field OFF.
#define STORES(OFF, V) Get R11; I32WrapI64; V; I64Store OFF

// PROBE sets R9 to the hit mask of position R12 over the ready lanes,
// probing the table only on the position's first visit in the query (the
// memo: Memo[p] valid when Stamp[p] == Gen), like consumer's probe. One
// table answers for every lane at once, so it ignores NEED.
// The state fields PROBE and the gallop read on every step, cached as raw
// bits in f64 locals by prefixSearch's prologue (the i64 locals are all
// taken): a local read is one instruction where a field load is a
// bounds-checked memory access. The kernel never changes them.
#define STAMP_P Get F16; I64ReinterpretF64
#define GEN32 Get F17; I64ReinterpretF64; I32WrapI64
#define MEMO_P Get F18; I64ReinterpretF64
#define SEQ_P Get F19; I64ReinterpretF64
#define READY64 Get F20; I64ReinterpretF64
#define N64 Get F22; I64ReinterpretF64

#define PROBE(NEED) \
	STAMP_P; Get R12; I64Const $2; I64Shl; I64Add; I32WrapI64; I32Load $0; \
	GEN32; I32Eq; \
	If; \
		MEMO_P; Get R12; I64Const $1; I64Shl; I64Add; I32WrapI64; I64Load16U $0; Set R9; \
	Else; \
		SEQ_P; Get R12; I64Const $3; I64Shl; I64Add; I32WrapI64; I64Load $0; Set R1; \
		PROBEHITS; \
		Get R9; READY64; I64And; Set R9; \
		MEMO_P; Get R12; I64Const $1; I64Shl; I64Add; I32WrapI64; Get R9; I64Store16 $0; \
		STAMP_P; Get R12; I64Const $2; I64Shl; I64Add; I32WrapI64; GEN32; I32Store $0; \
		STORES(S_PROBES, LOADS(S_PROBES); I64Const $1; I64Add); \
	End

// PUSH pushes the group (lanes L, a A, z Z) on the pending stack. Uses R1.
#define PUSH(L, A, Z) \
	Get R11; I64Const S_STACK; I64Add; LOADS(S_SP); I64Const $24; I64Mul; I64Add; Set R1; \
	Get R1; I32WrapI64; Get L; I64Store $0; \
	Get R1; I32WrapI64; Get A; I64Store $8; \
	Get R1; I32WrapI64; Get Z; I64Store $16; \
	STORES(S_SP, LOADS(S_SP); I64Const $1; I64Add)

// FORLANES runs BODY for every set bit of mask local M (consumed), with
// the bit's index in R1.
#define FORLANES(M, BODY) \
	Block; Loop; \
		Get M; I64Eqz; BrIf $1; \
		Get M; I64Ctz; Set R1; \
		BODY; \
		Get M; Get M; I64Const $1; I64Sub; I64And; Set M; \
		Br $0; \
	End; End

// SETDEPTH stores the value pushed by V as lane R1's depth (u32).
#define SETDEPTH(V) LOADS(S_DEPTH); Get R1; I64Const $2; I64Shl; I64Add; I32WrapI64; V; I64Store32 $0
// SETLO stores local A as lane R1's lo (i64).
#define SETLO(A) Get R11; I64Const S_LO; I64Add; Get R1; I64Const $3; I64Shl; I64Add; I32WrapI64; Get A; I64Store $0

#define PROBEHITS ROWHITS

// func prefixSearch(s *PrefixSearch, keyFlip, dispFlip, mask uint64, words *uint64, nwords int) bool
TEXT ·prefixSearch(SB), NOSPLIT, $0-49
	I64Load s+0(FP); Set R11
	I64Load keyFlip+8(FP); Set R2
	I64Load dispFlip+16(FP); Set R3
	I64Load mask+24(FP); Set R4
	I64Load words+32(FP); Set R0
	// The contract (SearchPrefix): n = len(Seq) ≥ 1, len(Memo) ≥ n,
	// len(Stamp) ≥ n, Depth ≠ nil, and (mask+1)·16 - 1 < nwords, wrapping
	// like the Go index expression it replaces. Otherwise report false.
	Get SP; I64Const $0; I64Store8 ret+48(FP)
	Block
		LOADS(S_N); I64Eqz; BrIf $0
		LOADS(S_MEMOLEN); LOADS(S_N); I64LtU; BrIf $0
		LOADS(S_STAMPLEN); LOADS(S_N); I64LtU; BrIf $0
		LOADS(S_DEPTH); I64Eqz; BrIf $0
		Get R4; I64Const $1; I64Add; I64Const $4; I64Shl; I64Const $1; I64Sub
		I64Load nwords+40(FP); I64GeU; BrIf $0
		Get SP; I64Const $1; I64Store8 ret+48(FP)
	End
	Get SP; I64Load8U ret+48(FP); I64Eqz
	If; RET; End
#include "search_wasm.h"

// Multi-group probes (PrefixSearch.GroupProbe, GROUPLOOP below). The groups
// are searchGroup records from GROUPS_P to GROUPS_END; the key is R1. R2, R3
// hold the key's seed-only hashes (bucket a and displacement before
// masking, kept across groups of one seed), R4 the lanes found; R5..R10 are
// used as in ROWHITS.
#define GROUPS_P Get F21; I64ReinterpretF64
#define GROUPS_END Get F23; I64ReinterpretF64
#define GFIELD(OFF) Get R0; I32WrapI64; I64Load OFF

// GKEYHASH is ROWHITS' addressing up to the masks (ckf.Addresser.HashKey)
// with the group's keyFlip and dispFlip: R2 = a, R3 = displacement before
// masking, R6 the fingerprint broadcast to four 16-bit lanes, R5 = ^R6.
#define GKEYHASH \
	Get R1; I64Const $32; I64Rotl; GFIELD($searchGroup_keyFlip); I64Xor; Tee R5; \
	Get R5; I64Const $49; I64Rotl; I64Xor; Get R5; I64Const $24; I64Rotl; I64Xor; \
	I64Const $0x9FB21C651E98DF25; I64Mul; Tee R5; Get R5; I64Const $35; I64ShrU; I64Const $8; I64Add; I64Xor; \
	I64Const $0x9FB21C651E98DF25; I64Mul; Tee R5; Get R5; I64Const $28; I64ShrU; I64Xor; Set R5; \
	Get R5; I64Const $0xFFFF; I64And; Tee R6; Get R6; I64Eqz; I64ExtendI32U; I64Or; Set R6; \
	Get R5; I64Const $16; I64ShrU; Set R2; \
	Get R6; I64Const $0xFF; I64And; I64Const $16; I64Shl; \
	Get R6; I64Const $8; I64ShrU; Tee R8; I64Const $24; I64Shl; I64Or; Get R8; I64Or; I64Const $0x200; I64Or; \
	GFIELD($searchGroup_dispFlip); I64Xor; \
	Tee R8; Get R8; I64Const $33; I64ShrU; I64Xor; I64Const $0xC2B2AE3D27D4EB4F; I64Mul; \
	Tee R8; Get R8; I64Const $29; I64ShrU; I64Xor; I64Const $0x165667B19E3779F9; I64Mul; \
	Tee R8; Get R8; I64Const $32; I64ShrU; I64Xor; Set R3; \
	Get R6; I64Const $0x0001000100010001; I64Mul; Tee R6; I64Const $-1; I64Xor; Set R5

// GROWS sets R7, R8 to the addresses of the group's rows A and B
// (ckf.Addresser.Rows): a = R2 & mask, b = a ^ (R3 & mask, 0 → 1), each
// times the row's bytes (<< shift, in F24 from the group's info) plus the
// table's address. Each field is loaded once (a local read is cheaper than
// a bounds-checked load).
#define GROWS \
	GFIELD($searchGroup_mask); Set R10; \
	Get R2; Get R10; I64And; Set R7; \
	Get R3; Get R10; I64And; Tee R8; Get R8; I64Eqz; I64ExtendI32U; I64Or; Get R7; I64Xor; Set R8; \
	GSHIFT; Set R10; \
	GFIELD($searchGroup_words); Set R9; \
	Get R7; Get R10; I64Shl; Get R9; I64Add; Set R7; \
	Get R8; Get R10; I64Shl; Get R9; I64Add; Set R8

// GSLOTS sets R9 to the slot hit mask of rows R7, R8 of the group's width
// (shift F24 = log2(width) + 3): ROWHITS' LANE tests of the width's slots,
// chosen by two tests of the width (three for 16), then the same fold.
#define GSHIFT Get F24; I64ReinterpretF64
#define GSLOTS \
	I64Const $0; Set R9; \
	GSHIFT; I64Const $5; I64GeU; \
	If; \
		GSHIFT; I64Const $6; I64GeU; \
		If; \
			GSHIFT; I64Const $7; I64Eq; \
			If; \
				LANE(120, 15); LANE(112, 14); LANE(104, 13); LANE(96, 12); \
				LANE(88, 11); LANE(80, 10); LANE(72, 9); LANE(64, 8); \
			End; \
			LANE(56, 7); LANE(48, 6); LANE(40, 5); LANE(32, 4); \
		End; \
		LANE(24, 3); LANE(16, 2); LANE(8, 1); LANE(0, 0); \
	Else; \
		GSHIFT; I64Const $4; I64Eq; \
		If; LANE(8, 1); End; \
		LANE(0, 0); \
	End; \
	Get R9; Get R9; I64Const $32; I64ShrU; I64Or; Tee R9; \
	Get R9; I64Const $16; I64ShrU; I64Or; I64Const $0xFFFF; I64And; Set R9

// GMAP ORs the lanes of slot hits R9 into R4: maps[0][R9 & 0xff] |
// maps[1][R9 >> 8], the second only for 16 slots (narrower rows have no
// hit above slot 7, and maps[1][0] is 0). It uses R10.
#define GMAP \
	GFIELD($searchGroup_maps); Set R10; \
	Get R4; \
	Get R10; Get R9; I64Const $0xFF; I64And; I64Const $1; I64Shl; I64Add; I32WrapI64; I64Load16U $0; I64Or; \
	Set R4; \
	GSHIFT; I64Const $7; I64Eq; \
	If; \
		Get R4; Get R10; Get R9; I64Const $8; I64ShrU; I64Const $1; I64Shl; I64Add; I32WrapI64; I64Load16U $512; I64Or; Set R4; \
	End

// GROUPLOOP ORs into R4 the lane hits of the groups with a lane in WANT
// (bits 0..15) and those groups' lanes (bits 16..31; PrefixSearch.GroupProbe)
// for key R1 (kept). The key is hashed at the first group of a run of
// same-seed groups when the run has a wanted lane (the run's lanes in bits
// 32..47 of that group's info; R2, R3, R5, R6 then hold the run's hash),
// so a run nobody wants costs no hash. It uses R0 (the group) and R2..R10.
#define WANT Get F26; I64ReinterpretF64
#define GROUPLOOP \
	GROUPS_P; Set R0; \
	Loop; \
		GFIELD($searchGroup_info); Tee R9; I64Const $32; I64ShrU; WANT; I64And; I64Eqz; I32Eqz; \
		If; GKEYHASH; End; \
		Get R9; WANT; I64And; I64Eqz; I32Eqz; \
		If; \
			Get R4; Get R9; I64Const $0xFFFF0000; I64And; I64Or; Set R4; \
			Get R9; I64Const $48; I64ShrU; F64ReinterpretI64; Set F24; \
			GROWS; GSLOTS; GMAP; \
		End; \
		Get R0; I64Const $searchGroup__size; I64Add; Tee R0; GROUPS_END; I64LtU; BrIf $0; \
	End

// func groupHits(gs *searchGroup, n int, key, want uint64) uint64
TEXT ·groupHits(SB), NOSPLIT, $0-40
	I64Load gs+0(FP); F64ReinterpretI64; Set F21
	I64Load gs+0(FP); I64Load n+8(FP); I64Const $searchGroup__size; I64Mul; I64Add; F64ReinterpretI64; Set F23
	I64Load key+16(FP); Set R1
	I64Load want+24(FP); F64ReinterpretI64; Set F26
	I64Const $0; Set R4
	GROUPLOOP
	Get SP; Get R4; I64Store ret+32(FP)
	RET

// GPROBE (multi-group PROBE) sets R9 to the hit mask of position R12 for at least
// the ready lanes of NEED, as consumer's probeTable: a position every ready
// lane was answered at (Stamp[p] == Gen) is the memo's, as in the one-table
// PROBE; on a first visit it counts the probe and starts with no lane
// answered; a position partly answered (Stamp[p] == Gen|1) starts from
// Memo[p] and Known[p]. It then reads the groups of the needed lanes not
// answered yet (the group loop LOOP), adds their hits and lanes to Memo[p]
// and Known[p], and stamps Gen when every ready lane is answered, Gen|1
// otherwise.
#undef PROBE
#define KNOWN_P Get F25; I64ReinterpretF64
#define GEN64 Get F17; I64ReinterpretF64
#define GPROBE(NEED, LOOP) \
	STAMP_P; Get R12; I64Const $2; I64Shl; I64Add; I32WrapI64; I64Load32U $0; Tee R9; \
	GEN64; I64Eq; \
	If; \
		MEMO_P; Get R12; I64Const $1; I64Shl; I64Add; I32WrapI64; I64Load16U $0; Set R9; \
	Else; \
		Get R9; GEN64; I64Const $1; I64Or; I64Eq; \
		If; \
			KNOWN_P; Get R12; I64Const $1; I64Shl; I64Add; I32WrapI64; I64Load16U $0; I64Const $16; I64Shl; \
			MEMO_P; Get R12; I64Const $1; I64Shl; I64Add; I32WrapI64; I64Load16U $0; I64Or; Set R4; \
		Else; \
			I64Const $0; Set R4; \
			STORES(S_PROBES, LOADS(S_PROBES); I64Const $1; I64Add); \
		End; \
		NEED; READY64; I64And; Get R4; I64Const $16; I64ShrU; I64Const $-1; I64Xor; I64And; Tee R9; F64ReinterpretI64; Set F26; \
		Get R9; I64Eqz; I32Eqz; \
		If; \
			SEQ_P; Get R12; I64Const $3; I64Shl; I64Add; I32WrapI64; I64Load $0; Set R1; \
			LOOP; \
		End; \
		Get R4; READY64; I64And; Set R9; \
		MEMO_P; Get R12; I64Const $1; I64Shl; I64Add; I32WrapI64; Get R9; I64Store16 $0; \
		Get R4; I64Const $16; I64ShrU; READY64; I64And; Set R4; \
		KNOWN_P; Get R12; I64Const $1; I64Shl; I64Add; I32WrapI64; Get R4; I64Store16 $0; \
		STAMP_P; Get R12; I64Const $2; I64Shl; I64Add; I32WrapI64; \
		GEN32; Get R4; READY64; I64Ne; I32Or; I32Store $0; \
	End
#define PROBE(NEED) GPROBE(NEED, GROUPLOOP)

#define S_FORMATS $PrefixSearch_formats
#define S_NFORMATS $(PrefixSearch_formats+8)
#define S_KNOWN $PrefixSearch_Known
#define S_KNOWNLEN $(PrefixSearch_Known+8)

// GROUPSCHECK sets R9 to 1 when the PrefixSearch at R11 keeps the
// multi-group kernels' contract, 0 otherwise: SearchPrefix's on the query,
// len(Known) ≥ n, and at least one group (each valid by construction:
// PrefixSearch.AddGroup). GROUPSLOCALS then caches what the probe reads.
#define GROUPSCHECK \
	I64Const $0; Set R9; \
	Block; \
		LOADS(S_N); I64Eqz; BrIf $0; \
		LOADS(S_MEMOLEN); LOADS(S_N); I64LtU; BrIf $0; \
		LOADS(S_STAMPLEN); LOADS(S_N); I64LtU; BrIf $0; \
		LOADS(S_KNOWNLEN); LOADS(S_N); I64LtU; BrIf $0; \
		LOADS(S_DEPTH); I64Eqz; BrIf $0; \
		LOADS(S_NFORMATS); I64Eqz; BrIf $0; \
		I64Const $1; Set R9; \
	End
#define GROUPSLOCALS \
	LOADS(S_FORMATS); F64ReinterpretI64; Set F21; \
	LOADS(S_FORMATS); LOADS(S_NFORMATS); I64Const $searchGroup__size; I64Mul; I64Add; F64ReinterpretI64; Set F23; \
	LOADS(S_KNOWN); F64ReinterpretI64; Set F25

// func prefixSearchGroups(s *PrefixSearch) bool
TEXT ·prefixSearchGroups(SB), NOSPLIT, $0-9
	I64Load s+0(FP); Set R11
	GROUPSCHECK
	Get SP; Get R9; I64Store8 ret+8(FP)
	Get R9; I64Eqz
	If; RET; End
	GROUPSLOCALS
#include "search_wasm.h"

// GKEYHASHN(F) is GKEYHASH for the group at R0 + F (its fields at F+…):
// R2 = a, R3 = the displacement before masking, the fingerprint broadcast
// in F27. It uses R9 and R10 only, so the rows (R7, R8) and fingerprint
// (R5, R6) of the group being read survive it.
#define GKEYHASHN(F) \
	Get R1; I64Const $32; I64Rotl; Get R0; I32WrapI64; I64Load $(F+searchGroup_keyFlip); I64Xor; Tee R10; \
	Get R10; I64Const $49; I64Rotl; I64Xor; Get R10; I64Const $24; I64Rotl; I64Xor; \
	I64Const $0x9FB21C651E98DF25; I64Mul; Tee R10; Get R10; I64Const $35; I64ShrU; I64Const $8; I64Add; I64Xor; \
	I64Const $0x9FB21C651E98DF25; I64Mul; Tee R10; Get R10; I64Const $28; I64ShrU; I64Xor; Set R10; \
	Get R10; I64Const $16; I64ShrU; Set R2; \
	Get R10; I64Const $0xFFFF; I64And; Tee R9; Get R9; I64Eqz; I64ExtendI32U; I64Or; Set R9; \
	Get R9; I64Const $0xFF; I64And; I64Const $16; I64Shl; \
	Get R9; I64Const $8; I64ShrU; Tee R10; I64Const $24; I64Shl; I64Or; Get R10; I64Or; I64Const $0x200; I64Or; \
	Get R0; I32WrapI64; I64Load $(F+searchGroup_dispFlip); I64Xor; \
	Tee R10; Get R10; I64Const $33; I64ShrU; I64Xor; I64Const $0xC2B2AE3D27D4EB4F; I64Mul; \
	Tee R10; Get R10; I64Const $29; I64ShrU; I64Xor; I64Const $0x165667B19E3779F9; I64Mul; \
	Tee R10; Get R10; I64Const $32; I64ShrU; I64Xor; Set R3; \
	Get R9; I64Const $0x0001000100010001; I64Mul; F64ReinterpretI64; Set F27

// GROUPLOOPP is GROUPLOOP with the key hash software-pipelined, for groups
// of several seeds: the next group's run is hashed (into R2, R3 and F27)
// once this group's row addresses are computed and before its slot tests,
// so that hash's multiply chain overlaps this group's loads instead of
// following them; the fingerprint moves to R6 (R5 = ^R6) at the end of the
// iteration, and the first group's run is hashed before the loop. This
// group's info waits in F28. The order costs a one-seed consumer ≈ 6–10%
// (extra moves and tests per group, no hash to overlap), hence the two
// kernels (BENCHMARKS.md, "Format groups", fourth pass).
#define GROUPLOOPP \
	GROUPS_P; Set R0; \
	GFIELD($searchGroup_info); I64Const $32; I64ShrU; WANT; I64And; I64Eqz; I32Eqz; \
	If; GKEYHASHN(0); Get F27; I64ReinterpretF64; Tee R6; I64Const $-1; I64Xor; Set R5; End; \
	Loop; \
		GFIELD($searchGroup_info); Tee R9; F64ReinterpretI64; Set F28; \
		Get R9; WANT; I64And; I64Eqz; I32Eqz; \
		If; \
			Get R4; Get R9; I64Const $0xFFFF0000; I64And; I64Or; Set R4; \
			Get R9; I64Const $48; I64ShrU; F64ReinterpretI64; Set F24; \
			GROWS; \
		End; \
		Get R6; F64ReinterpretI64; Set F27; \
		Get R0; I64Const $searchGroup__size; I64Add; GROUPS_END; I64LtU; \
		If; \
			Get R0; I32WrapI64; I64Load $(searchGroup__size+searchGroup_info); I64Const $32; I64ShrU; WANT; I64And; I64Eqz; I32Eqz; \
			If; GKEYHASHN(searchGroup__size); End; \
		End; \
		Get F28; I64ReinterpretF64; WANT; I64And; I64Eqz; I32Eqz; \
		If; GSLOTS; GMAP; End; \
		Get F27; I64ReinterpretF64; Tee R6; I64Const $-1; I64Xor; Set R5; \
		Get R0; I64Const $searchGroup__size; I64Add; Tee R0; GROUPS_END; I64LtU; BrIf $0; \
	End

#undef PROBE
#define PROBE(NEED) GPROBE(NEED, GROUPLOOPP)

// func prefixSearchRuns(s *PrefixSearch) bool
TEXT ·prefixSearchRuns(SB), NOSPLIT, $0-9
	I64Load s+0(FP); Set R11
	GROUPSCHECK
	Get SP; Get R9; I64Store8 ret+8(FP)
	Get R9; I64Eqz
	If; RET; End
	GROUPSLOCALS
#include "search_wasm.h"
