package consumer

import (
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// mixedManifest configures every lane and pins no format: each lane's
// format comes from its assignment (a version-2 manifest).
func mixedManifest() Manifest {
	m := testManifest(lanes, 64)
	m.Format = ckf.Format{}
	return m
}

// laneWordsFor returns a table of format f holding the first depth hashes
// of seq (and no others).
func laneWordsFor(t tb, f ckf.Format, seq []uint64, depth int) []uint64 {
	words := make([]uint64, f.BucketCount)
	ad := f.Addresser()
	for _, h := range seq[:depth] {
		a := ad.Address(h)
		require.True(t, place(words, a.A, a.Fingerprint) || place(words, a.B, a.Fingerprint), "both buckets full")
	}
	return words
}

// install assigns lane l of c to format f at epoch and installs words.
func install(t tb, c *Consumer, l int, f ckf.Format, epoch uint64, words []uint64) {
	t.Helper()
	id := testIdentity(l, f.BucketCount)
	id.Format = f
	lease := testLease(l, epoch)
	require.NoError(t, c.Assign(id, lease), "Assign lane %d", l)
	r := c.InstallSnapshot(&ckf.Snapshot{Identity: id, Lease: lease, Sequence: epoch, Words: words})
	require.Equal(t, SnapshotInstalled, r.Outcome, "install lane %d: got %v", l, r)
}

// TestConsumer_MixedFormats_property: 16 lanes of random formats (several
// seeds and bucket counts, so groups of every width and groups sharing a
// seed) answer every query exactly as 16 one-lane consumers of each lane's
// own format do — fast and linear search, Contains and lane words — and
// keep doing so after random lanes resubscribe in another format (leaving,
// widening and dropping groups).
func TestConsumer_MixedFormats_property(t *testing.T) {
	seeds := []uint64{testSeed, 7, 1 << 40}
	counts := []uint64{64, 256, 1024}
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 40).Draw(t, "blocks")
		// Distinct hashes: each lane's membership is then a prefix, where
		// the fast search is exact whatever the other lanes hold.
		base := rapid.Uint64().Draw(t, "base")
		seq := make([]uint64, n)
		for i := range seq {
			seq[i] = ckf.ChainHash(base, uint64(i))
		}
		c, err := New(mixedManifest())
		require.NoError(t, err)
		var refs [lanes]*Consumer
		epoch := [lanes]uint64{}
		reinstall := func(l int) {
			f := ckf.NewFormat(seeds[rapid.IntRange(0, len(seeds)-1).Draw(t, "seed")], counts[rapid.IntRange(0, len(counts)-1).Draw(t, "buckets")])
			words := laneWordsFor(t, f, seq, rapid.IntRange(0, n).Draw(t, "depth"))
			epoch[l]++
			predicted := c.TableBytesAfterAssign(l, f)
			install(t, c, l, f, epoch[l], words)
			require.Equal(t, predicted, c.Stats().TableBytes, "TableBytesAfterAssign is exact")
			m := testManifest(lanes, f.BucketCount)
			m.Format = f
			ref, err := New(m)
			require.NoError(t, err)
			install(t, ref, l, f, epoch[l], words)
			refs[l] = ref
		}
		for l := range lanes {
			if rapid.IntRange(0, 5).Draw(t, "skip") > 0 {
				reinstall(l)
			}
		}
		check := func(stage string) {
			var got, gotLin QueryResult
			errFast := c.QuerySequenceHashes(seq, &got)
			errLin := c.QuerySequenceHashesLinear(seq, &gotLin)
			require.Equal(t, errFast, errLin)
			var mask uint16
			for l, ref := range refs {
				if ref == nil {
					continue
				}
				mask |= 1 << l
				// Fast against fast: with repeated hashes membership need
				// not be monotone, where the fast search may differ from
				// the linear one (SPEC §8.4) — but never between consumers.
				var want, wantLin QueryResult
				require.NoError(t, ref.QuerySequenceHashes(seq, &want))
				require.NoError(t, ref.QuerySequenceHashesLinear(seq, &wantLin))
				require.Equal(t, want.Depths[l], got.Depths[l], "%s: lane %d fast depth", stage, l)
				require.Equal(t, wantLin.Depths[l], gotLin.Depths[l], "%s: lane %d linear depth", stage, l)
				wantWords, err := ref.AppendLaneWords(nil, l)
				require.NoError(t, err)
				gotWords, err := c.AppendLaneWords(nil, l)
				require.NoError(t, err)
				require.Equal(t, wantWords, gotWords, "%s: lane %d words", stage, l)
			}
			require.Equal(t, mask, got.Mask, stage)
			require.LessOrEqual(t, got.Probes, n, "%s: at most one probe a position", stage)
			for _, h := range seq[:min(n, 3)] {
				gm, _ := c.Contains(h)
				var wm uint16
				for l, ref := range refs {
					if ref != nil {
						m, _ := ref.Contains(h)
						wm |= m & (1 << l)
					}
				}
				require.Equal(t, wm, gm, "%s: contains", stage)
			}
			// The layout rule: one group is the 16-lane table (slot l =
			// lane l: the one-table path); several have rows of their
			// lane count rounded up to a power of two.
			var total uint64
			for _, g := range c.groups {
				if len(c.groups) == 1 {
					require.True(t, g.identity() && c.uniform, "%s: one group: the 16-lane table", stage)
				} else {
					require.Equal(t, max(1, 1<<bitsLen(popcount(g.members)-1)), g.width, "%s: group of %d lanes has rows of %d", stage, popcount(g.members), g.width)
				}
				total += uint64(len(g.words)) * 8
			}
			require.Equal(t, total, c.Stats().TableBytes, stage)
		}
		check("first")
		for range rapid.IntRange(1, 6).Draw(t, "moves") {
			reinstall(rapid.IntRange(0, lanes-1).Draw(t, "lane"))
			check("after a resubscribe")
		}
	})
}

func popcount(m uint16) int {
	n := 0
	for ; m != 0; m &= m - 1 {
		n++
	}
	return n
}

func bitsLen(x int) int {
	n := 0
	for ; x > 0; x >>= 1 {
		n++
	}
	return n
}

// TestConsumer_OneGroupRunsTodaysPath is the structural check of the
// uniform case: a version-1 manifest, and manifests with no pin whose lanes
// were all assigned one format — in lane order, in reverse order, or only
// three of them — hold one 16-wide group where slot l is lane l, so queries
// take the one-table path (LaneRowHits, and in WebAssembly the search
// kernel: Consumer.uniform) with the same depths and probe counts. A second
// format turns the groups narrow; when it leaves, the one group is the
// 16-lane table again.
func TestConsumer_OneGroupRunsTodaysPath(t *testing.T) {
	f := ckf.NewFormat(testSeed, 4096)
	seq := make([]uint64, 300)
	for i := range seq {
		seq[i] = ckf.ChainHash(99, uint64(i))
	}
	v1 := testManifest(lanes, f.BucketCount)
	c1, err := New(v1)
	require.NoError(t, err)
	c2, err := New(mixedManifest())
	require.NoError(t, err)
	c3, err := New(mixedManifest())
	require.NoError(t, err)
	for l := range lanes {
		words := laneWordsFor(t, f, seq, 17*l)
		install(t, c1, l, f, 1, words)
		install(t, c2, l, f, 1, words)
		r := lanes - 1 - l
		install(t, c3, r, f, 1, laneWordsFor(t, f, seq, 17*r))
	}
	require.True(t, c1.uniform, "version-1 manifest: the one 16-lane table")
	require.True(t, c2.uniform, "one format assigned in lane order: the one 16-lane table")
	require.True(t, c3.uniform, "one format assigned in reverse order: the one 16-lane table")
	for _, c := range []*Consumer{c1, c2, c3} {
		require.Len(t, c.groups, 1)
		require.Equal(t, lanes, c.groups[0].width)
	}
	c4, err := New(mixedManifest())
	require.NoError(t, err)
	for _, l := range []int{9, 2, 5} {
		install(t, c4, l, f, 1, laneWordsFor(t, f, seq, 17*l))
		require.True(t, c4.uniform, "three lanes of one format, lane %d assigned", l)
	}
	g := ckf.NewFormat(testSeed, 64)
	install(t, c4, 7, g, 1, laneWordsFor(t, g, seq, 3))
	require.False(t, c4.uniform, "two formats: the group path")
	require.Equal(t, []int{4, 1}, []int{c4.groups[0].width, c4.groups[1].width}, "rows of 3 lanes → 4, of 1 lane → 1")
	install(t, c4, 7, f, 2, laneWordsFor(t, f, seq, 17*7))
	require.True(t, c4.uniform, "back to one format: the 16-lane table again")
	var r4, r1 QueryResult
	require.NoError(t, c4.QuerySequenceHashes(seq, &r4))
	require.NoError(t, c1.QuerySequenceHashes(seq, &r1))
	for _, l := range []int{2, 5, 7, 9} {
		require.Equal(t, r1.Depths[l], r4.Depths[l], "lane %d", l)
	}
	require.Equal(t, len(c1.words), int(f.BucketCount)*lanes)
	for _, n := range []int{1, 5, 64, 255, 300} {
		var r1, r2, r3 QueryResult
		require.NoError(t, c1.QuerySequenceHashes(seq[:n], &r1))
		require.NoError(t, c2.QuerySequenceHashes(seq[:n], &r2))
		require.NoError(t, c3.QuerySequenceHashes(seq[:n], &r3))
		require.Equal(t, r1, r2, "%d blocks", n)
		require.Equal(t, r1, r3, "%d blocks", n)
		for l := range lanes {
			require.Equal(t, uint32(min(n, 17*l)), r1.Depths[l], "%d blocks, lane %d", n, l)
		}
	}
	// The one-table path keeps no multi-group scratch: no known lanes per
	// position (the search's memo answers every lane at a visited position).
	for _, c := range []*Consumer{c1, c2, c3} {
		require.Nil(t, c.q.known, "one group: no known-lanes scratch")
		require.Nil(t, c.q.kernel.Known, "one group: the kernel gets no Known")
	}
}

// TestConsumer_FormatPinsAndInvalidFormats: a lane pinned by the manifest
// refuses another format, an unpinned lane refuses an invalid one (a bucket
// count that is not a power of two, a zero format), each as
// ErrFormatMismatch with the lane untouched (still ready, same words, no
// group created); a pin on an unconfigured lane or an invalid pin fails
// validation.
func TestConsumer_FormatPinsAndInvalidFormats(t *testing.T) {
	m := mixedManifest()
	pinned := ckf.NewFormat(testSeed, 128)
	m.LaneFormats[1] = pinned
	c, err := New(m)
	require.NoError(t, err)
	f := ckf.NewFormat(5, 64)
	seq := []uint64{ckf.ChainHash(1, 2)}
	install(t, c, 0, f, 1, laneWordsFor(t, f, seq, 1))
	install(t, c, 1, pinned, 1, laneWordsFor(t, pinned, seq, 1))
	before := c.Stats()
	wordsBefore, err := c.AppendLaneWords(nil, 0)
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		lane int
		f    ckf.Format
	}{
		{"pinned lane, another format", 1, f},
		{"bucket count not a power of two", 0, ckf.NewFormat(5, 96)},
		{"bucket count above 2^24", 0, ckf.NewFormat(5, 1<<25)},
		{"zero format", 0, ckf.Format{}},
		{"fingerprint bits", 0, ckf.Format{Version: 1, Seed: 5, BucketCount: 64, FingerprintBits: 8, SlotsPerBucket: 4}},
	} {
		id := testIdentity(tc.lane, 64)
		id.Format = tc.f
		err := c.Assign(id, testLease(tc.lane, 9))
		require.ErrorIs(t, err, ErrFormatMismatch, tc.name)
		s, _ := c.LaneStatus(tc.lane)
		require.True(t, s.Ready, "%s: lane untouched", tc.name)
		require.Equal(t, uint64(1), s.LastEpoch, "%s: epoch untouched", tc.name)
		require.Equal(t, before, c.Stats(), "%s: no group created", tc.name)
	}
	got, err := c.AppendLaneWords(nil, 0)
	require.NoError(t, err)
	require.Equal(t, wordsBefore, got)

	bad := mixedManifest()
	bad.Lanes[3] = nil
	bad.LaneFormats[3] = pinned
	_, err = New(bad)
	require.ErrorIs(t, err, ErrInvalidManifest, "a pin on an unconfigured lane")
	bad = mixedManifest()
	bad.LaneFormats[2] = ckf.NewFormat(1, 3)
	_, err = New(bad)
	require.ErrorIs(t, err, ErrInvalidManifest, "an invalid pin")
}
