package ckf

import (
	"encoding/binary"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zeebo/xxh3"
	"pgregory.net/rapid"
)

// The batch kernels (kernels.go) must equal the per-item Go reference and
// zeebo/xxh3 over the same bytes. On GOARCH=wasm these tests exercise the
// hand-written WebAssembly: internal/cmd/wasirun's test builds this
// package's tests for wasip1 and runs them under wazero.

func TestKernels_Arch(t *testing.T) {
	t.Logf("GOARCH=%s", runtime.GOARCH) // shows which kernels a run tested
}

func encodeTokens(tokens []uint32) []byte {
	b := make([]byte, 0, 4*len(tokens))
	for _, tok := range tokens {
		b = binary.LittleEndian.AppendUint32(b, tok)
	}
	return b
}

// checkHashBlocks compares hashBlocks with the reference and with
// xxh3.HashSeed of each block's little-endian bytes.
func checkHashBlocks(t require.TestingT, tokens []uint32, blockSize int, salt uint64) {
	for _, special := range []bool{true, false} {
		useSeq64 = special
		checkHashBlocksOnce(t, tokens, blockSize, salt)
	}
	useSeq64 = true
}

func checkHashBlocksOnce(t require.TestingT, tokens []uint32, blockSize int, salt uint64) {
	n := len(tokens) / blockSize
	got := make([]uint64, n)
	hashBlocks(got, tokens, blockSize, salt)
	ref := make([]uint64, n)
	hashBlocksGo(ref, tokens, blockSize, salt)
	require.Equal(t, ref, got, "blockSize %d salt %#x", blockSize, salt)
	// The two kernels composed in place, as QueryTokens uses them.
	seq := AppendLocalBlockHashes([]uint64{7}, tokens, blockSize, salt)
	require.Equal(t, append([]uint64{7}, got...), seq)
	seq = AppendSequenceHashes(seq[1:1], seq[1:])
	require.Equal(t, append([]uint64{7}, seq...), AppendTokenSequenceHashes([]uint64{7}, tokens, blockSize, salt))
	one := make([]uint64, n)
	tokenSequenceGo(one, tokens, blockSize, salt)
	require.Equal(t, seq, one)
	if n > 0 {
		chained := xxh3.HashSeed(encodeTokens(tokens[:blockSize]), salt)
		require.Equal(t, chained, seq[0])
		for i := 1; i < n; i++ {
			local := xxh3.HashSeed(encodeTokens(tokens[i*blockSize:(i+1)*blockSize]), salt)
			pair := binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, chained), local)
			chained = xxh3.HashSeed(pair, sequenceSeed)
			require.Equal(t, chained, seq[i], "sequence hash %d", i)
		}
	}
	for i := range n {
		want := xxh3.HashSeed(encodeTokens(tokens[i*blockSize:(i+1)*blockSize]), salt)
		require.Equal(t, want, got[i], "block %d of %d tokens, salt %#x", i, blockSize, salt)
	}
}

func TestHashBlocks_MatchesXXH3(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		// 1..72 tokens covers the kernel's 17..128-byte range, both edges
		// and the Go fallback on either side.
		blockSize := rapid.IntRange(1, 72).Draw(t, "blockSize")
		n := rapid.IntRange(0, 9).Draw(t, "blocks")
		extra := rapid.IntRange(0, blockSize-1).Draw(t, "partial")
		tokens := rapid.SliceOfN(rapid.Uint32(), n*blockSize+extra, n*blockSize+extra).Draw(t, "tokens")
		checkHashBlocks(t, tokens, blockSize, seedGen().Draw(t, "salt"))
	})
}

// TestHashBlocks_EveryKernelLength checks every byte length of the kernel's
// range (and one past each end) with fixed random tokens.
func TestHashBlocks_EveryKernelLength(t *testing.T) {
	tokens := make([]uint32, 3*40)
	for i := range tokens {
		tokens[i] = uint32(benchKeyLike(uint64(i)))
	}
	for blockSize := 4; blockSize <= 33; blockSize++ {
		for _, salt := range []uint64{0, BaseSalt, ^uint64(0), 1 << 63} {
			checkHashBlocks(t, tokens[:3*blockSize], blockSize, salt)
		}
	}
}

// benchKeyLike is a splitmix64 step: deterministic, well-mixed test words.
func benchKeyLike(i uint64) uint64 {
	z := i + 0x9E3779B97F4A7C15
	z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
	z = (z ^ z>>27) * 0x94D049BB133111EB
	return z ^ z>>31
}

func checkChain(t require.TestingT, locals []uint64) {
	got := append([]uint64(nil), locals...)
	chainInPlace(got)
	ref := append([]uint64(nil), locals...)
	chainInPlaceGo(ref)
	require.Equal(t, ref, got)
	for i := 1; i < len(locals); i++ {
		buf := binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, got[i-1]), locals[i])
		require.Equal(t, xxh3.HashSeed(buf, sequenceSeed), got[i], "step %d", i)
	}
	if len(locals) > 0 {
		require.Equal(t, locals[0], got[0])
	}
}

func TestChainInPlace_MatchesXXH3(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		checkChain(t, rapid.SliceOfN(rapid.Uint64(), 0, 40).Draw(t, "locals"))
	})
}

func TestAppendSequenceHashes_InPlace(t *testing.T) {
	locals := []uint64{1, 2, 3, 0xFFFF_FFFF_FFFF_FFFF, 0}
	want := AppendSequenceHashes(nil, locals)
	got := AppendSequenceHashes(locals[:0], locals)
	require.Equal(t, want, got)
}

// FuzzKernels feeds arbitrary bytes as tokens, block size and salt to
// hashBlocks and as chain words to chainInPlace.
func FuzzKernels(f *testing.F) {
	f.Add([]byte("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"), uint8(16), uint64(BaseSalt))
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}, uint8(5), uint64(0))
	f.Add(make([]byte, 129), uint8(32), ^uint64(0))
	f.Fuzz(func(t *testing.T, data []byte, bs uint8, salt uint64) {
		blockSize := int(bs%64) + 1
		tokens := make([]uint32, len(data)/4)
		words := make([]uint64, len(data)/8)
		for i := range tokens {
			tokens[i] = binary.LittleEndian.Uint32(data[4*i:])
		}
		for i := range words {
			words[i] = binary.LittleEndian.Uint64(data[8*i:])
		}
		checkHashBlocks(t, tokens, blockSize, salt)
		checkChain(t, words)
	})
}

// rowTable draws a small lane-minor table in which some keys' fingerprints
// sit in some lanes' bucket a or b (so hits occur), with random other slots.
func rowTable(t *rapid.T) (Addresser, []uint64, []uint64) {
	buckets := uint64(1) << rapid.IntRange(1, 8).Draw(t, "logBuckets")
	ad := NewAddresser(seedGen().Draw(t, "seed"), buckets)
	words := make([]uint64, buckets*MaxLanes)
	for i := range words {
		if rapid.Bool().Draw(t, "randomWord") {
			words[i] = rapid.Uint64().Draw(t, "word")
		}
	}
	keys := rapid.SliceOfN(rapid.Uint64(), 1, 8).Draw(t, "keys")
	for _, k := range keys {
		a := ad.Address(k)
		for l := range MaxLanes {
			if rapid.Bool().Draw(t, "store") {
				bk := a.A
				if rapid.Bool().Draw(t, "inB") {
					bk = a.B
				}
				slot := rapid.IntRange(0, 3).Draw(t, "slot")
				words[bk*MaxLanes+uint64(l)] = uint64(Bucket(words[bk*MaxLanes+uint64(l)]).WithSlot(slot, a.Fingerprint))
			}
		}
	}
	return ad, words, keys
}

// rowHitsScalar is an independent reference: Address and the slot-by-slot
// scan of every lane's two buckets.
func rowHitsScalar(ad Addresser, words []uint64, key uint64) uint16 {
	a := ad.Address(key)
	var m uint16
	for l := range uint64(MaxLanes) {
		if Bucket(words[a.A*MaxLanes+l]).containsScalar(a.Fingerprint) || Bucket(words[a.B*MaxLanes+l]).containsScalar(a.Fingerprint) {
			m |= 1 << l
		}
	}
	return m
}

func TestLaneRowHits_MatchesReference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ad, words, keys := rowTable(t)
		keys = append(keys, rapid.Uint64().Draw(t, "other"))
		for _, k := range keys {
			want := rowHitsScalar(ad, words, k)
			require.Equal(t, want, laneRowHitsGo(ad, words, k), "Go reference, key %#x", k)
			require.Equal(t, want, ad.LaneRowHits(words, k), "LaneRowHits, key %#x", k)
		}
	})
}

func TestLaneRowHits_ShortTablePanics(t *testing.T) {
	ad := NewAddresser(DefaultSeed, 8)
	require.Panics(t, func() { ad.LaneRowHits(make([]uint64, 8*MaxLanes-1), 1) })
	require.NotPanics(t, func() { ad.LaneRowHits(make([]uint64, 8*MaxLanes), 1) })
}

// FuzzLaneRowHits: arbitrary table bytes, seed and key.
func FuzzLaneRowHits(f *testing.F) {
	f.Add(make([]byte, 8*MaxLanes*2), uint64(DefaultSeed), uint64(1))
	f.Add([]byte("\x01\x00\x01\x00\x01\x00\x01\x00 a table of two rows of sixteen lanes, all words, more of them ..............................................................................................................................................................."), uint64(0), ^uint64(0))
	f.Fuzz(func(t *testing.T, data []byte, seed, key uint64) {
		buckets := uint64(2)
		for buckets*2*MaxLanes*8 <= uint64(len(data)) {
			buckets *= 2
		}
		words := make([]uint64, buckets*MaxLanes)
		for i := range words {
			if 8*i+8 <= len(data) {
				words[i] = binary.LittleEndian.Uint64(data[8*i:])
			}
		}
		ad := NewAddresser(seed, buckets)
		want := rowHitsScalar(ad, words, key)
		require.Equal(t, want, laneRowHitsGo(ad, words, key))
		require.Equal(t, want, ad.LaneRowHits(words, key))
	})
}

// TestKernelConstants pins the constants the assembly spells out: the
// secret words shared with xxh3small.go, the chain seed terms and
// 64 × PRIME64_1 of the one-pass kernel (kernels_wasm.s, CHAINK and HASH64).
func TestKernelConstants(t *testing.T) {
	require.Equal(t, xxhSecret64At8, xxhSecretWords[1])
	require.Equal(t, xxhSecret64At16, xxhSecretWords[2])
	require.Equal(t, xxhSecret64At24, xxhSecretWords[3])
	require.Equal(t, xxhSecret64At32, xxhSecretWords[4])
	require.Equal(t, xxhSecret64At40, xxhSecretWords[5])
	require.Equal(t, xxhSecret64At48, xxhSecretWords[6])
	// Word 0's two 32-bit halves (xxh3small.go uses only their XOR).
	require.Equal(t, xxhSecret32At0^xxhSecret32At4, xxhSecretWords[0]>>32^xxhSecretWords[0]&0xFFFFFFFF)
	require.Equal(t, uint64(0x6782737bea423ef2), uint64(chainFlipLo))
	require.Equal(t, uint64(0xaf56bc3b09964d01), uint64(chainFlipHi))
	p1 := uint64(0x9E3779B185EBCA87)
	require.Equal(t, uint64(0x8dde6c617af2a1c0), 64*p1)
}

// TestKernel_SearchPrefixRefusesBrokenContract: SearchPrefix checks its
// contract in the kernel (so the call inlines) and reports false, touching
// nothing, for each way to break it; a valid call reports true on wasm (the
// only architecture with the kernel) and false elsewhere.
func TestKernel_SearchPrefixRefusesBrokenContract(t *testing.T) {
	const buckets = 16
	ad := NewAddresser(DefaultSeed, buckets)
	words := make([]uint64, buckets*MaxLanes)
	valid := func() *PrefixSearch {
		return &PrefixSearch{Seq: []uint64{1, 2, 3}, Memo: make([]uint16, 3), Stamp: make([]uint32, 3), Gen: 1,
			Ready: 0xFFFF, Window: 2, Depth: &[MaxLanes]uint32{7, 7, 7}}
	}
	for _, tc := range []struct {
		name  string
		words []uint64
		edit  func(*PrefixSearch)
	}{
		{"empty query", words, func(s *PrefixSearch) { s.Seq = s.Seq[:0] }},
		{"short memo", words, func(s *PrefixSearch) { s.Memo = s.Memo[:2] }},
		{"short stamp", words, func(s *PrefixSearch) { s.Stamp = s.Stamp[:2] }},
		{"nil depth", words, func(s *PrefixSearch) { s.Depth = nil }},
		{"short table", words[:len(words)-1], func(*PrefixSearch) {}},
		{"nil table", nil, func(*PrefixSearch) {}},
	} {
		s := valid()
		tc.edit(s)
		require.False(t, ad.SearchPrefix(tc.words, s), tc.name)
		require.Zero(t, s.Probes, "%s: probes", tc.name)
		if s.Depth != nil {
			require.Equal(t, uint32(7), s.Depth[0], "%s: depth untouched", tc.name)
		}
	}
	s := valid()
	require.Equal(t, runtime.GOARCH == "wasm", ad.SearchPrefix(words, s), "valid call")
	if runtime.GOARCH == "wasm" {
		require.Equal(t, 1, s.Probes, "valid call: one probe (an empty table misses at position 0)")
	}
}

// TestKernel_SearchGroupsRefusesBrokenContract: SearchGroups checks its
// contract in the kernel — SearchPrefix's on the query, a Known as long as
// the query (the multi-group probe writes the lanes each position answered)
// and at least one group — and reports false, touching nothing, for each
// way to break it; a valid call reports true on wasm and false elsewhere.
func TestKernel_SearchGroupsRefusesBrokenContract(t *testing.T) {
	const buckets = 16
	maps := new([2][256]uint16)
	for v := range 256 {
		maps[0][v] = uint16(v)
	}
	for _, runs := range []int{1, 2} { // both multi-group kernels
		valid := func() *PrefixSearch {
			s := &PrefixSearch{Seq: []uint64{1, 2, 3}, Memo: make([]uint16, 3), Stamp: make([]uint32, 3), Known: make([]uint16, 3),
				Gen: 2, Ready: 0xF, Window: 2, Depth: &[MaxLanes]uint32{7, 7, 7}}
			for r := range runs {
				s.AddGroup(NewAddresser(DefaultSeed+uint64(r), buckets), make([]uint64, buckets*4), 4, maps, 0xF<<(4*r))
			}
			s.Ready = 1<<(4*runs) - 1
			require.Equal(t, runs, s.runs)
			return s
		}
		testSearchGroupsContract(t, valid)
	}
}

func testSearchGroupsContract(t *testing.T, valid func() *PrefixSearch) {
	for _, tc := range []struct {
		name string
		edit func(*PrefixSearch)
	}{
		{"empty query", func(s *PrefixSearch) { s.Seq = s.Seq[:0] }},
		{"short memo", func(s *PrefixSearch) { s.Memo = s.Memo[:2] }},
		{"short stamp", func(s *PrefixSearch) { s.Stamp = s.Stamp[:2] }},
		{"short known", func(s *PrefixSearch) { s.Known = s.Known[:2] }},
		{"nil known", func(s *PrefixSearch) { s.Known = nil }},
		{"nil depth", func(s *PrefixSearch) { s.Depth = nil }},
		{"no group", func(s *PrefixSearch) { s.ResetGroups() }},
	} {
		s := valid()
		tc.edit(s)
		require.False(t, s.SearchGroups(), tc.name)
		require.Zero(t, s.Probes, "%s: probes", tc.name)
		if s.Depth != nil {
			require.Equal(t, uint32(7), s.Depth[0], "%s: depth untouched", tc.name)
		}
	}
	s := valid()
	require.Equal(t, runtime.GOARCH == "wasm", s.SearchGroups(), "valid call")
	if runtime.GOARCH == "wasm" {
		require.Equal(t, 1, s.Probes, "valid call: one probe (an empty table misses at position 0)")
		require.Equal(t, s.Ready, s.Known[0], "position 0 answered for the ready lanes")
		require.Equal(t, s.Gen, s.Stamp[0], "position 0 stamped as answered for every ready lane")
	}
}

// TestPrefixSearch_AddGroupCountsRuns: AddGroup counts the runs of
// same-seed neighbours (what picks the wasm kernel that pipelines the key
// hash) and ResetGroups forgets them.
func TestPrefixSearch_AddGroupCountsRuns(t *testing.T) {
	maps := new([2][256]uint16)
	var s PrefixSearch
	for i, seed := range []uint64{DefaultSeed, DefaultSeed, 7, DefaultSeed} {
		s.AddGroup(NewAddresser(seed, 16), make([]uint64, 16), 1, maps, 1<<i)
	}
	require.Equal(t, 3, s.runs, "seeds A A B A: three runs")
	s.ResetGroups()
	require.Zero(t, s.runs)
	s.AddGroup(NewAddresser(7, 16), make([]uint64, 16), 1, maps, 1)
	require.Equal(t, 1, s.runs)
}

// TestKernel_SearchRunsEqualsSearchGroups: on groups of several seeds the
// kernel that hashes the next run while a group's rows load
// (prefixSearchRuns) leaves exactly what the one-run kernel
// (prefixSearchGroups, forced by runs = 1) leaves: depths, probes, memo,
// stamps and known lanes, for any ready lanes and window, over two
// generations (the second reads the first's memo as stale). Off wasm there
// is no kernel.
func TestKernel_SearchRunsEqualsSearchGroups(t *testing.T) {
	if runtime.GOARCH != "wasm" {
		t.Skip("no search kernel off wasm")
	}
	rapid.Check(t, func(t *rapid.T) {
		c := drawGroups(t)
		var gs PrefixSearch
		for i := range c.ads {
			gs.AddGroup(c.ads[i], c.words[i], c.widths[i], c.maps[i], c.member[i])
		}
		n := rapid.IntRange(1, 300).Draw(t, "n")
		seq := make([]uint64, n)
		for i := range seq {
			seq[i] = c.keys[rapid.IntRange(0, len(c.keys)-1).Draw(t, "key")]
		}
		ready := rapid.OneOf(rapid.Just(uint16(0xFFFF)), rapid.Uint16()).Draw(t, "ready")
		window := rapid.IntRange(0, 8).Draw(t, "window")
		run := func(runs int) *PrefixSearch {
			s := &PrefixSearch{Seq: seq, Memo: make([]uint16, n), Stamp: make([]uint32, n), Known: make([]uint16, n),
				Ready: ready, Window: window, Depth: new([MaxLanes]uint32)}
			s.formats, s.runs = gs.formats, runs
			for range 2 {
				s.Gen += 2
				require.True(t, s.SearchGroups())
			}
			return s
		}
		got, want := run(gs.runs), run(1)
		require.Equal(t, *want.Depth, *got.Depth, "depths (%d runs)", gs.runs)
		require.Equal(t, want.Probes, got.Probes, "probes")
		require.Equal(t, [3]any{want.Memo, want.Stamp, want.Known}, [3]any{got.Memo, got.Stamp, got.Known}, "memo, stamps, known")
		require.Equal(t, [3]any{want.Fallback, want.Resume, want.Lo}, [3]any{got.Fallback, got.Resume, got.Lo}, "what the kernel leaves to Go")
	})
}
