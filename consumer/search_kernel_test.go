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
// probes and the same memo afterwards.
func searchBoth(t tb, c *Consumer, seq []uint64) {
	t.Helper()
	var got, want QueryResult
	require.NoError(t, c.QuerySequenceHashes(seq, &got))
	memo, stamp := append([]uint16(nil), c.q.memo...), append([]uint32(nil), c.q.stamp...)
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
	for p := range seq { // same positions probed, same masks
		require.Equal(t, c.q.stamp[p] == c.q.gen, stamp[p] == gen, "position %d probed", p)
		if stamp[p] == gen {
			require.Equal(t, c.q.memo[p], memo[p], "position %d mask", p)
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
