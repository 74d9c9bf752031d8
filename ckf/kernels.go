package ckf

// Batch kernels. Each processes a whole batch per call: on GOARCH=wasm they
// are hand-written WebAssembly (kernels_wasm.s), elsewhere plain Go
// (kernels_other.go) that calls the same reference code the wasm versions are
// tested against (kernels_test.go: equal to the per-item Go code and to
// zeebo/xxh3 on random inputs, run under wazero by internal/cmd/wasirun).
// Go's wasm code generation keeps values in linear memory between
// operations and emulates the 64×64→128 multiply through bits.Mul64's
// generic code; the kernels keep everything in wasm locals and amortise the
// call over the batch (BENCHMARKS.md, "Wasm kernels").

// xxhSecretWords are the first 128 bytes of the XXH3 default secret as
// little-endian words: word i is bytes [8i, 8i+8).
var xxhSecretWords = [16]uint64{
	0xbe4ba423396cfeb8, 0x1cad21f72c81017c, 0xdb979083e96dd4de, 0x1f67b3b7a4a44072,
	0x78e5c0cc4ee679cb, 0x2172ffcc7dd05a82, 0x8e2443f7744608b8, 0x4c263a81e69035e0,
	0xcb00c391bb52283c, 0xa32e531b8b65d088, 0x4ef90da297486471, 0xd8acdea946ef1938,
	0x3f349ce33f76faa8, 0x1d4f0bc7c7bbdcf9, 0x3159b4cd4be0518a, 0x647378d9c97e9fc8,
}

// xxh3Keys17to128 returns the seeded secret of the 17..128-byte XXH3 path:
// even words plus the seed, odd words minus it.
//
//lint:ignore U1000 used by the wasm kernels (kernels_wasm.go); other architectures hash in Go
func xxh3Keys17to128(seed uint64) (k [16]uint64) {
	for i, w := range xxhSecretWords {
		if i%2 == 0 {
			k[i] = w + seed
		} else {
			k[i] = w - seed
		}
	}
	return k
}

// useSeq64 selects the wasm kernel specialised for 16-token (64-byte)
// blocks; tests and benchmarks clear it to check and compare the generic
// path. Other architectures ignore it.
//
//lint:ignore U1000 read by the wasm kernels only (kernels_wasm.go); tests set it everywhere
var useSeq64 = true

// hashBlocks sets dst[i] to the local hash of tokens[i*blockSize :
// (i+1)*blockSize] for every i < len(dst). tokens must hold at least
// len(dst)*blockSize tokens; blockSize > 0.
func hashBlocks(dst []uint64, tokens []uint32, blockSize int, salt uint64) {
	if len(dst) == 0 {
		return
	}
	_ = tokens[len(dst)*blockSize-1] // one bounds check for the batch
	hashBlocksArch(dst, tokens, blockSize, salt)
}

// hashBlocksGo is the per-block reference of hashBlocks.
func hashBlocksGo(dst []uint64, tokens []uint32, blockSize int, salt uint64) {
	for i := range dst {
		dst[i] = localBlockHash(tokens[i*blockSize:(i+1)*blockSize], salt)
	}
}

// tokenSequenceGo is AppendTokenSequenceHashes' one-loop Go body: dst[i] is
// the sequence hash of block i.
func tokenSequenceGo(dst []uint64, tokens []uint32, blockSize int, salt uint64) {
	var prev uint64
	for i := range dst {
		local := localBlockHash(tokens[i*blockSize:(i+1)*blockSize], salt)
		if i == 0 {
			prev = local
		} else {
			prev = ChainHash(prev, local)
		}
		dst[i] = prev
	}
}

// chainInPlace turns local hashes into the canonical chain in place:
// h[i] = ChainHash(h[i-1], h[i]) for i ≥ 1.
func chainInPlace(h []uint64) {
	if len(h) < 2 {
		return
	}
	chainInPlaceArch(h)
}

// chainInPlaceGo is the per-step reference of chainInPlace.
func chainInPlaceGo(h []uint64) {
	for i := 1; i < len(h); i++ {
		h[i] = ChainHash(h[i-1], h[i])
	}
}

// PrefixSearch is the input and output of [Addresser.SearchPrefix]: package
// consumer's prefix search (SPEC §8.4; consumer's searchFast is the
// reference and documents the algorithm) over one query, run as one
// hand-written WebAssembly call. The search is the consumer's, but the
// kernel lives here because it inlines the row probe of
// [Addresser.LaneRowHits] (Go's assembler cannot name a symbol of a package
// whose path holds a dot, so the probe cannot be called from elsewhere).
type PrefixSearch struct {
	// Seq holds the query's sequence hashes; Memo and Stamp (at least
	// len(Seq) long) memoize each position's hit mask: Memo[p] is valid when
	// Stamp[p] == Gen. The kernel reads and extends the memo.
	Seq   []uint64
	Memo  []uint16
	Stamp []uint32
	Gen   uint32
	// Ready is the lanes the query answers for; Window the verification
	// window (≥ 0).
	Ready  uint16
	Window int
	// Lo (output) is each lane's last hit found by the gallop and binary
	// search, -1 for none; Depth (output) each lane's depth where the kernel
	// settled it.
	Lo    [MaxLanes]int
	Depth *[MaxLanes]uint32
	// Probes (output) is the number of table probes made.
	Probes int
	// Fallback (output): lanes whose depth needs the caller's linear
	// rescan (a window miss at the window's left edge) after a shared
	// window pass with tentative depth T and window start Left; Resume: the
	// lane at which the caller must continue the lane-by-lane window pass
	// (for the same reason), or -1 when every lane was settled.
	Fallback uint16
	T, Left  int
	Resume   int

	// The kernel's scratch: pending groups (lanes, a, z), their count, the
	// number of final groups and the last group's lanes.
	//
	//lint:ignore U1000 read and written by the wasm kernel (kernels_wasm.s) at fixed offsets
	stack [3 * MaxLanes]int
	//lint:ignore U1000 as stack
	sp, groups int
	//lint:ignore U1000 as stack
	arg int

	// Known (multi-group searches only, [PrefixSearch.SearchGroups]; at
	// least len(Seq) long): the lanes Memo[p] answers for when Stamp[p] ==
	// Gen. A multi-group probe reads only the groups of the lanes the
	// search needs at p ([PrefixSearch.GroupProbe]); a later need of other
	// lanes at p reads their groups then, without counting a probe.
	//
	// It is the last exported field so that the one-group kernel's field
	// offsets stay those it was written against.
	Known []uint16

	// formats: the format groups of a multi-group search
	// (PrefixSearch.AddGroup); runs: how many runs of same-seed groups
	// they form (the wasm kernel pipelines the key hash when > 1).
	formats []searchGroup
	runs    int
}

// SearchPrefix runs s on the lane-minor table words (as for
// [Addresser.LaneRowHits]) and reports true, on GOARCH=wasm; elsewhere it
// does nothing and reports false, and the caller runs its Go search (which
// the compiler already keeps in registers). It also does nothing and
// reports false when s breaks its contract: len(s.Seq) ≥ 1, Memo and Stamp
// at least as long, Depth non-nil and words holding every row the
// addressing can reach (the kernel checks this itself, so the call inlines:
// in WebAssembly every Go call on the query path costs tens of
// nanoseconds).
func (ad Addresser) SearchPrefix(words []uint64, s *PrefixSearch) bool {
	return searchPrefixArch(ad.keyFlip, ad.dispFlip, ad.mask, words, s)
}
