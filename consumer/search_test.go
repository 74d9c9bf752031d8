package consumer

import (
	"fmt"
	"math/bits"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"pgregory.net/rapid"
)

const searchBuckets = 4096

// buildLanes returns a consumer whose ready lanes hold exactly the positions
// of seq marked in member[l] (nil: lane l is not installed), plus the true
// per-position hit masks read back through Contains.
// tb is the part of testing.TB that *rapid.T also implements.
type tb interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	FailNow()
}

func buildLanes(t tb, window int, seq []uint64, member [lanes][]bool) (*Consumer, []uint16) {
	t.Helper()
	m := testManifest(lanes, searchBuckets)
	m.VerificationWindow = window
	c, err := New(m)
	require.NoError(t, err, "New")
	for l := range lanes {
		if member[l] == nil {
			continue
		}
		words := make([]uint64, searchBuckets)
		for p, in := range member[l] {
			if !in {
				continue
			}
			ad := c.addresser.Address(seq[p])
			require.False(t, !place(words, ad.A, ad.Fingerprint) && !place(words, ad.B, ad.Fingerprint), "lane %d position %d: both buckets full", l, p)
		}
		lease := testLease(l, 1)
		id := testIdentity(l, searchBuckets)
		require.NoError(t, c.Assign(id, lease), "Assign")
		r := c.InstallSnapshot(&ckf.Snapshot{Identity: id, Lease: lease, Sequence: 1, Words: words})
		require.Equal(t, SnapshotInstalled, r.Outcome, "install lane %d: got %v", l, r)
	}
	truth := make([]uint16, len(seq))
	if c.ReadyMask() != 0 {
		for p, h := range seq {
			truth[p], _ = c.Contains(h)
		}
	}
	return c, truth
}

func place(words []uint64, bucket uint64, fp uint16) bool {
	b := ckf.Bucket(words[bucket])
	if s := b.LowestEmpty(); s >= 0 {
		words[bucket] = uint64(b.WithSlot(s, fp))
		return true
	}
	return false
}

// linearDepth is an independent reference: leading hits of lane l in truth.
func linearDepth(truth []uint16, l int) uint32 {
	for p, m := range truth {
		if m&(1<<l) == 0 {
			return uint32(p)
		}
	}
	return uint32(len(truth))
}

func monotone(truth []uint16, l int) bool {
	d := int(linearDepth(truth, l))
	for _, m := range truth[d:] {
		if m&(1<<l) != 0 {
			return false
		}
	}
	return true
}

func TestSearch_FastEqualsLinearForMonotoneLanes(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(0, 300).Draw(rt, "n")
		window := rapid.IntRange(1, MaxVerificationWindow).Draw(rt, "window")
		seq := make([]uint64, n)
		for i := range seq {
			// Offsets keep hashes distinct when rapid shrinks draws to 0.
			seq[i] = rapid.Uint64().Draw(rt, "hash") + uint64(i)*0x9E3779B97F4A7C15
		}
		ready := rapid.Uint16().Draw(rt, "ready")
		var member [lanes][]bool
		for l := range lanes {
			if ready&(1<<l) == 0 {
				continue
			}
			member[l] = make([]bool, n)
			if rapid.Bool().Draw(rt, fmt.Sprintf("monotone%d", l)) {
				d := rapid.IntRange(0, n).Draw(rt, "depth")
				for p := range d {
					member[l][p] = true
				}
			} else {
				density := rapid.IntRange(0, 100).Draw(rt, "density")
				for p := range n {
					member[l][p] = rapid.IntRange(0, 99).Draw(rt, "bit") < density
				}
			}
		}
		c, truth := buildLanes(rt, window, seq, member)
		var fast, lin QueryResult
		errF := c.QuerySequenceHashes(seq, &fast)
		errL := c.QuerySequenceHashesLinear(seq, &lin)
		if ready == 0 {
			require.ErrorIs(rt, errF, ErrUnavailable, "no ready lane: fast")
			require.ErrorIs(rt, errL, ErrUnavailable, "no ready lane: linear")
			return
		}
		require.NoError(rt, errF, "fast")
		require.NoError(rt, errL, "linear")
		require.Equal(rt, ready, fast.Mask, "fast mask")
		require.Equal(rt, ready, lin.Mask, "linear mask")
		require.LessOrEqual(rt, fast.Probes, 2*n+16, "got %d probes for n=%d, want ≤ %d", fast.Probes, n, 2*n+16)
		for l := range lanes {
			if ready&(1<<l) == 0 {
				require.Equal(rt, uint32(0), fast.Depths[l], "lane %d not ready: got depth %d, want 0", l, fast.Depths[l])
				continue
			}
			want := linearDepth(truth, l)
			require.Equal(rt, want, lin.Depths[l], "lane %d: linear search got %d, want %d", l, lin.Depths[l], want)
			d := int(fast.Depths[l])
			require.False(rt, monotone(truth, l) && fast.Depths[l] != want, "monotone lane %d (window %d): fast got %d, want %d", l, window, d, want)
			// Any lane: the depth is a boundary of the lane's membership.
			if d > n || d > 0 && truth[d-1]&(1<<l) == 0 || d < n && truth[d]&(1<<l) != 0 {
				require.Fail(rt, fmt.Sprintf("lane %d: fast depth %d is not a hit/miss boundary of %v", l, d, laneBits(truth, l)))
			}
		}
	})
}

func laneBits(truth []uint16, l int) string {
	b := make([]byte, len(truth))
	for p, m := range truth {
		b[p] = '0' + byte(m>>l&1)
	}
	return string(b)
}

// TestSearch_NonMonotoneLanes pins what the fast search answers when a lane's
// membership has holes: it is an approximation, bounded and documented.
func TestSearch_NonMonotoneLanes(t *testing.T) {
	tests := []struct {
		name   string
		bits   string // lane 0 membership per position
		window int
		want   uint32
		linear uint32
	}{
		// Gallop samples 1,2,4,7 all hit; the window [6,7] sees no miss.
		{"hole below the window is missed", "11101111", 2, 8, 3},
		// Window [6,7] misses at its left edge 6: rescan from the last
		// confirmed hit (4) finds the miss at 5.
		{"left-edge miss falls back to a linear rescan", "11101001", 2, 5, 3},
		// Window [5,7] misses first at 6, inside the window: depth 6.
		{"miss inside the window lowers the depth", "11101101", 3, 6, 3},
		// A wider window reaches the hole: left edge 2 hits, 3 misses.
		{"wide window reaches the hole", "11101111", 6, 3, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			seq := make([]uint64, len(tc.bits))
			for i := range seq {
				seq[i] = uint64(i)*0x9E3779B97F4A7C15 + 1
			}
			var member [lanes][]bool
			member[0] = make([]bool, len(seq))
			for i, ch := range tc.bits {
				member[0][i] = ch == '1'
			}
			c, truth := buildLanes(t, tc.window, seq, member)
			got := laneBits(truth, 0)
			require.Equal(t, tc.bits, got, "table holds %s, want %s (false positive in the fixture)", got, tc.bits)
			var fast, lin QueryResult
			require.NoError(t, c.QuerySequenceHashes(seq, &fast))
			require.NoError(t, c.QuerySequenceHashesLinear(seq, &lin))
			require.Equal(t, tc.want, fast.Depths[0], "fast depth")
			require.Equal(t, tc.linear, lin.Depths[0], "linear depth")
		})
	}
}

func TestSearch_ProbesShareRowsAcrossLanes(t *testing.T) {
	// 16 lanes at 16 different depths of a 1024-block query: one probe per
	// position serves every lane, so probes stay far below 16 binary searches.
	n := 1024
	seq := make([]uint64, n)
	for i := range seq {
		seq[i] = uint64(i)*0xBF58476D1CE4E5B9 + 7
	}
	var member [lanes][]bool
	for l := range lanes {
		member[l] = make([]bool, n)
		for p := range (l * 997) % (n + 1) {
			member[l][p] = true
		}
	}
	c, truth := buildLanes(t, 2, seq, member)
	var res QueryResult
	require.NoError(t, c.QuerySequenceHashes(seq, &res))
	for l := range lanes {
		want := linearDepth(truth, l)
		require.Equal(t, want, res.Depths[l], "lane %d: got %d, want %d", l, res.Depths[l], want)
	}
	limit := 16 * (bits.Len(uint(n)) + 2)
	require.LessOrEqual(t, res.Probes, limit, "got %d probes, want ≤ %d", res.Probes, limit)
	t.Logf("1024 blocks, 16 lanes: %d probes", res.Probes)
}
