package consumer

import (
	"encoding/binary"
	"testing"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// kernelPaths counts how often a kernel run left the provenance fallback to
// Go (shared window, lane by lane), so the tests can show they reached it.
var kernelPaths struct{ fallback, resume int }

// searchBoth runs the query through the wasm search kernel and through the
// Go search on the same consumer and requires the same result, the same
// probes and the same memo afterwards (with several format groups, also the
// same lanes answered at each position: the same groups read).
func searchBoth(t tb, c *Consumer, seq []uint64) {
	t.Helper()
	var got, want QueryResult
	require.NoError(t, c.QuerySequenceHashes(seq, &got))
	memo, stamp := append([]uint16(nil), c.q.memo...), append([]uint32(nil), c.q.stamp...)
	known := append([]uint16(nil), c.q.known...)
	gen := c.q.gen
	if c.q.kernel.Fallback != 0 {
		kernelPaths.fallback++
	}
	if c.q.kernel.Resume >= 0 {
		kernelPaths.resume++
	}
	useSearchKernel = false
	defer func() { useSearchKernel = true }()
	require.NoError(t, c.QuerySequenceHashes(seq, &want))
	require.Equal(t, want, got, "kernel result vs Go")
	// visit: 0 not probed, 1 every ready lane answered, 2 some (several
	// format groups: probeTable).
	visit := func(st, g uint32) uint32 {
		if st|1 != g|1 {
			return 0
		}
		return 1 + st - g
	}
	for p := range seq { // same positions probed, same masks
		v := visit(stamp[p], gen)
		require.Equal(t, visit(c.q.stamp[p], c.q.gen), v, "position %d probed", p)
		if v != 0 {
			require.Equal(t, c.q.memo[p], memo[p], "position %d mask", p)
		}
		if v != 0 && !c.uniform { // several groups: the same groups read at p
			require.Equal(t, c.q.known[p], known[p], "position %d lanes answered", p)
		}
	}
}

// TestSearch_KernelEqualsGo: the hand-written WebAssembly search
// (ckf.Addresser.SearchPrefix) returns what searchFast's Go code returns,
// with the same probes, on monotone and non-monotone lanes, lanes sharing a
// depth, every window. It runs inside the guest (internal/cmd/wasirun
// TestGuestKernels); natively there is no kernel to compare.
func TestSearch_KernelEqualsGo(t *testing.T) {
	if !hasSearchKernel {
		t.Skip("no search kernel on " + "this architecture: run under GOARCH=wasm (internal/cmd/wasirun)")
	}
	// Both fallbacks, by construction: lanes hit 0..39 except 38, so the
	// binary search settles at 40 and the window [38, 40) misses at its left
	// edge. All lanes alike take the shared window; with lane 1 at depth 10
	// the pass goes lane by lane.
	const n = 64
	seq := make([]uint64, n)
	for i := range seq {
		seq[i] = uint64(i+1) * 0x9E3779B97F4A7C15
	}
	holed := make([]bool, n)
	for p := range 40 {
		holed[p] = p != 38
	}
	short := make([]bool, n)
	for p := range 10 {
		short[p] = true
	}
	kernelPaths.fallback, kernelPaths.resume = 0, 0
	c, _ := buildLanes(t, 2, seq, [lanes][]bool{0: holed, 1: holed, 5: holed})
	searchBoth(t, c, seq)
	c, _ = buildLanes(t, 2, seq, [lanes][]bool{0: holed, 1: short, 2: holed})
	searchBoth(t, c, seq)
	require.Equal(t, 1, kernelPaths.fallback, "the shared-window fallback")
	require.Equal(t, 1, kernelPaths.resume, "the lane-by-lane fallback")

	rapid.Check(t, func(rt *rapid.T) {
		window, seq, member := drawMembership(rt, 300)
		c, _ := buildLanes(rt, window, seq, member)
		if c.ReadyMask() == 0 {
			return
		}
		searchBoth(rt, c, seq)
	})
	t.Logf("kernel runs that left a fallback to Go: shared %d, lane by lane %d", kernelPaths.fallback, kernelPaths.resume)
}

// FuzzSearchKernel: the kernel against the Go search on memberships built
// from the input (2 bytes of membership bits per position and lane group).
func FuzzSearchKernel(f *testing.F) {
	f.Add(uint8(2), uint16(0xFFFF), []byte{0xff, 0xff, 0xff, 0xff, 0x0f, 0xf0, 0x00, 0xff})
	f.Add(uint8(1), uint16(0x8001), []byte{1, 0, 0, 0, 3, 0, 1, 0, 0x81, 0x80})
	f.Add(uint8(0), uint16(3), []byte{3})
	f.Fuzz(func(t *testing.T, window uint8, ready uint16, data []byte) {
		if !hasSearchKernel {
			t.Skip("no search kernel on this architecture")
		}
		n := len(data) / 2
		if n == 0 || ready == 0 || n > 512 {
			return
		}
		seq := make([]uint64, n)
		var member [lanes][]bool
		for l := range lanes {
			if ready&(1<<l) != 0 {
				member[l] = make([]bool, n)
			}
		}
		for p := range n {
			seq[p] = uint64(p+1) * 0x9E3779B97F4A7C15
			bits := binary.LittleEndian.Uint16(data[2*p:])
			for l := range lanes {
				if member[l] != nil {
					member[l][p] = bits&(1<<l) != 0
				}
			}
		}
		c, _ := buildLanes(t, 1+int(window)%MaxVerificationWindow, seq, member)
		searchBoth(t, c, seq)
	})
}

// buildMixedLanes is buildLanes with lane l in format formats[l] (a
// version-2 manifest pinning none), so several formats make format groups
// of narrow rows.
func buildMixedLanes(t tb, window int, seq []uint64, member [lanes][]bool, formats [lanes]ckf.Format) *Consumer {
	t.Helper()
	m := mixedManifest()
	m.VerificationWindow = window
	c, err := New(m)
	require.NoError(t, err, "New")
	for l := range lanes {
		if member[l] == nil {
			continue
		}
		f := formats[l]
		words := make([]uint64, f.BucketCount)
		ad := f.Addresser()
		for p, in := range member[l] {
			if in {
				a := ad.Address(seq[p])
				require.True(t, place(words, a.A, a.Fingerprint) || place(words, a.B, a.Fingerprint), "lane %d position %d: both buckets full", l, p)
			}
		}
		install(t, c, l, f, 1, words)
	}
	return c
}

// drawFormats draws each lane's format from few seeds and bucket counts, so
// groups of every width, groups sharing a seed and single-lane groups occur.
func drawFormats(rt *rapid.T) (fs [lanes]ckf.Format) {
	seeds := []uint64{testSeed, 7, 1 << 40}
	counts := []uint64{1024, 2048, 4096, 8192} // room for 300 positions: both buckets full is then negligible
	k := rapid.IntRange(1, 6).Draw(rt, "formats")
	pool := make([]ckf.Format, k)
	for i := range pool {
		pool[i] = ckf.NewFormat(seeds[rapid.IntRange(0, len(seeds)-1).Draw(rt, "seed")], counts[rapid.IntRange(0, len(counts)-1).Draw(rt, "buckets")])
	}
	for l := range fs {
		fs[l] = pool[rapid.IntRange(0, k-1).Draw(rt, "format")]
	}
	return fs
}

// TestSearch_GroupKernelEqualsGo: with lanes in several formats (format
// groups of narrow rows) the hand-written WebAssembly search
// (ckf.PrefixSearch.SearchGroups, the multi-group probe inlined) returns
// what the Go search returns, with the same probes and memo, on monotone
// and non-monotone lanes, shared depths and every window, and reaches both
// fallbacks. It runs inside the guest (internal/cmd/wasirun
// TestGuestKernels).
func TestSearch_GroupKernelEqualsGo(t *testing.T) {
	if !hasSearchKernel {
		t.Skip("no search kernel on this architecture: run under GOARCH=wasm (internal/cmd/wasirun)")
	}
	const n = 64
	seq := make([]uint64, n)
	for i := range seq {
		seq[i] = uint64(i+1) * 0x9E3779B97F4A7C15
	}
	holed := make([]bool, n)
	for p := range 40 {
		holed[p] = p != 38
	}
	short := make([]bool, n)
	for p := range 10 {
		short[p] = true
	}
	three := [lanes]ckf.Format{0: ckf.NewFormat(testSeed, 1024), 1: ckf.NewFormat(7, 2048), 2: ckf.NewFormat(testSeed, 4096), 5: ckf.NewFormat(7, 2048)}
	kernelPaths.fallback, kernelPaths.resume = 0, 0
	c := buildMixedLanes(t, 2, seq, [lanes][]bool{0: holed, 1: holed, 5: holed}, three)
	require.False(t, c.uniform)
	searchBoth(t, c, seq)
	c = buildMixedLanes(t, 2, seq, [lanes][]bool{0: holed, 1: short, 2: holed}, three)
	searchBoth(t, c, seq)
	require.Equal(t, 1, kernelPaths.fallback, "the shared-window fallback")
	require.Equal(t, 1, kernelPaths.resume, "the lane-by-lane fallback")

	rapid.Check(t, func(rt *rapid.T) {
		window, seq, member := drawMembership(rt, 300)
		c := buildMixedLanes(rt, window, seq, member, drawFormats(rt))
		if c.ReadyMask() == 0 {
			return
		}
		searchBoth(rt, c, seq)
	})
}

// TestSearch_GroupProbesEqualReadingEveryGroup: with lanes in several
// formats a probe reads only the groups of the lanes the search needs at a
// position (probeTable, and the multi-group kernel's PROBE in wasm builds);
// the depths and probe counts stay those of the per-round reference search,
// whose every probe needs every ready lane and so reads every group — on
// monotone and non-monotone lanes, where the provenance fallback asks a
// visited position about a lane no probe there needed.
func TestSearch_GroupProbesEqualReadingEveryGroup(t *testing.T) {
	// The fallback's case by construction: lane 0 hits 0..39 but 34 and 38,
	// lane 1 (another group) 0..35. They split at 39; lane 1's binary
	// search visits 35, 37 and 36 reading its group only; lane 0's window
	// [38, 40) misses at its left edge, and the rescan starts after the
	// last visited position where lane 0 hits: 37, which must read lane
	// 0's group there (a memo read alone finds 32 and answers 34).
	const n = 64
	seq := make([]uint64, n)
	for i := range seq {
		seq[i] = uint64(i+1) * 0x9E3779B97F4A7C15
	}
	holed, short := make([]bool, n), make([]bool, n)
	for p := range 40 {
		holed[p] = p != 34 && p != 38
	}
	for p := range 36 {
		short[p] = true
	}
	two := [lanes]ckf.Format{0: ckf.NewFormat(testSeed, 1024), 1: ckf.NewFormat(7, 2048)}
	c := buildMixedLanes(t, 2, seq, [lanes][]bool{0: holed, 1: short}, two)
	var got, want QueryResult
	require.NoError(t, c.QuerySequenceHashes(seq, &got))
	queryRounds(c, seq, &want)
	require.Equal(t, want, got)
	require.Equal(t, [2]uint32{38, 36}, [2]uint32{got.Depths[0], got.Depths[1]})

	rapid.Check(t, func(rt *rapid.T) {
		window, seq, member := drawMembership(rt, 300)
		c := buildMixedLanes(rt, window, seq, member, drawFormats(rt))
		var got, want QueryResult
		require.NoError(rt, c.QuerySequenceHashes(seq, &got))
		queryRounds(c, seq, &want)
		require.Equal(rt, want, got)
	})
}

// TestSearch_GroupProbeReadsTheNeededGroups: 16 lanes in four format
// groups at 16 depths (BenchmarkConsumerQueryMixed's pattern): once the
// binary search has split the lanes, a probe reads the one group of the
// lane it settles, so far fewer groups are read than four a probe, and the
// positions read for one lane answer for exactly its group's lanes.
func TestSearch_GroupProbeReadsTheNeededGroups(t *testing.T) {
	const n = 512
	seq := make([]uint64, n)
	for i := range seq {
		seq[i] = uint64(i)*0xBF58476D1CE4E5B9 + 7
	}
	var member [lanes][]bool
	var formats [lanes]ckf.Format
	for l := range lanes {
		member[l] = make([]bool, n)
		for p := range n * (lanes - l) / lanes {
			member[l][p] = true
		}
		formats[l] = ckf.NewFormat(testSeed+uint64(l%4), 4096>>(l%4)) // lanes 0, 4, 8, 12 share a group
	}
	c := buildMixedLanes(t, 2, seq, member, formats)
	require.Len(t, c.groups, 4)
	var res QueryResult
	require.NoError(t, c.QuerySequenceHashes(seq, &res))
	for l := range lanes {
		require.Equal(t, uint32(n*(lanes-l)/lanes), res.Depths[l], "lane %d", l)
	}
	reads, oneGroup := 0, 0
	for p := range seq {
		if !c.q.visited(p) {
			continue
		}
		known := c.q.known[p]
		read := 0
		for _, g := range c.groups {
			if g.members&known == g.members {
				read++
			}
		}
		require.NotZero(t, read, "position %d: a visited position read a group", p)
		require.Equal(t, c.q.stamp[p] == c.q.gen, known == c.ready, "position %d: stamped gen only when every lane is answered", p)
		if read == 1 {
			oneGroup++
		}
		reads += read
	}
	t.Logf("%d probes read %d groups (%d read one)", res.Probes, reads, oneGroup)
	require.Less(t, reads, 2*res.Probes, "groups read: fewer than half of four a probe")
	require.Greater(t, oneGroup, res.Probes/2, "most probes read one group")
}

// TestSearch_GenerationWraps: the memo's generation steps by 2 (gen|1
// marks a position partly answered); when it wraps every stamp is cleared,
// so stamps of an old query (here generation 2, the first after the wrap)
// never alias the new one's.
func TestSearch_GenerationWraps(t *testing.T) {
	const n = 128
	seqA, seqB := make([]uint64, n), make([]uint64, n)
	for i := range seqA {
		seqA[i] = uint64(i+1) * 0x9E3779B97F4A7C15
		seqB[i] = uint64(i+1) * 0xBF58476D1CE4E5B9
	}
	var member [lanes][]bool
	var formats [lanes]ckf.Format
	for l := range 8 {
		member[l] = make([]bool, n)
		for p := range n * (8 - l) / 8 {
			member[l][p] = true
		}
		formats[l] = ckf.NewFormat(testSeed+uint64(l%2), 2048)
	}
	c := buildMixedLanes(t, 2, seqA, member, formats)
	var want, got QueryResult
	queryRounds(c, seqB, &want)
	c.q.gen = 0 // the next query runs at generation 2, as the first after a wrap
	require.NoError(t, c.QuerySequenceHashes(seqA, &got))
	require.Equal(t, uint32(2), c.q.gen)
	c.q.gen = ^uint32(0) - 1 // the last even generation: the next query wraps
	require.NoError(t, c.QuerySequenceHashes(seqB, &got))
	require.Equal(t, uint32(2), c.q.gen, "wrapped")
	require.Equal(t, want, got, "no stamp of the query at generation 2 is the new query's")
}
