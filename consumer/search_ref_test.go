package consumer

import (
	"fmt"
	"math/bits"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// searchFastRounds is the search as it was before the grouped binary search
// (kept as the reference the new bookkeeping must match exactly): the
// binary search advanced all open lanes one round at a time, regrouping
// lanes by midpoint with a pass over the lanes per probe.
func (c *Consumer) searchFastRounds(ready uint16, depth *[lanes]uint32) {
	n := len(c.q.seq)
	var lo, hi [lanes]int // lo: a known hit (or -1), hi: a known miss (or n)
	active := c.probe(0, ready)
	for l := range lanes {
		lo[l], hi[l] = -1, 0
	}
	// Gallop: every active lane has hit every sampled position so far.
	last := 0
	for m := active; m != 0; m &= m - 1 {
		l := bits.TrailingZeros16(m)
		lo[l], hi[l] = 0, n
	}
	for p := 1; active != 0 && last < n-1; p *= 2 {
		if p > n-1 {
			p = n - 1
		}
		h := c.probe(p, ready)
		for m := active &^ h; m != 0; m &= m - 1 {
			l := bits.TrailingZeros16(m)
			lo[l], hi[l] = last, p
		}
		active &= h
		for m := active; m != 0; m &= m - 1 {
			l := bits.TrailingZeros16(m)
			lo[l] = p
		}
		last = p
	}
	// Grouped binary search: one probe per distinct midpoint per round.
	var open uint16
	for m := ready; m != 0; m &= m - 1 {
		l := bits.TrailingZeros16(m)
		if hi[l]-lo[l] > 1 {
			open |= 1 << l
		}
	}
	for open != 0 {
		l0 := bits.TrailingZeros16(open)
		mid := lo[l0] + (hi[l0]-lo[l0])/2
		var group uint16
		for m := open; m != 0; m &= m - 1 {
			l := bits.TrailingZeros16(m)
			if lo[l]+(hi[l]-lo[l])/2 == mid {
				group |= 1 << l
			}
		}
		h := c.probe(mid, ready)
		for m := group; m != 0; m &= m - 1 {
			l := bits.TrailingZeros16(m)
			if h&(1<<l) != 0 {
				lo[l] = mid
			} else {
				hi[l] = mid
			}
			if hi[l]-lo[l] <= 1 {
				open &^= 1 << l
			}
		}
	}
	// Verification window and provenance fallback.
	w := c.window
	for m := ready; m != 0; m &= m - 1 {
		l := bits.TrailingZeros16(m)
		t := lo[l] + 1 // tentative depth
		if t == 0 {
			depth[l] = 0
			continue
		}
		left := max(0, t-w)
		miss := -1
		for p := left; p < t; p++ {
			if c.probe(p, ready)&(1<<l) == 0 {
				miss = p
				break
			}
		}
		switch {
		case miss < 0:
		case miss == left && left > 0:
			// The miss may extend below the window: rescan from the last
			// position this query confirmed as a hit for the lane.
			from := 0
			for p := left - 1; p >= 0; p-- {
				if c.q.stamp[p] == c.q.gen && c.q.memo[p]&(1<<l) != 0 {
					from = p + 1
					break
				}
			}
			t = from
			for t < miss && c.probe(t, ready)&(1<<l) != 0 {
				t++
			}
		default:
			t = miss
		}
		depth[l] = uint32(t)
	}
}

// queryRounds runs searchFastRounds over seq like QuerySequenceHashes.
func queryRounds(c *Consumer, seq []uint64, res *QueryResult) {
	ready := c.ready
	*res = QueryResult{Mask: ready, Blocks: len(seq)}
	if ready == 0 || len(seq) == 0 {
		return
	}
	saved := c.q.seq
	c.q.seq = seq
	before := c.q.probes
	c.q.prepare(len(seq), !c.uniform)
	c.searchFastRounds(ready, &res.Depths)
	res.Probes = int(c.q.probes - before)
	c.q.seq = saved
}

// TestSearch_GroupedEqualsRounds: on any membership, monotone or not, the
// grouped binary search and the shared window pass return the same depths with the same number of
// probes as the per-round search it replaced.
func TestSearch_GroupedEqualsRounds(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		window, seq, member := drawMembership(rt, 400)
		c, _ := buildLanes(rt, window, seq, member)
		var got, want QueryResult
		require.NoError(rt, c.QuerySequenceHashes(seq, &got))
		queryRounds(c, seq, &want)
		require.Equal(rt, want, got)
	})
}

// drawMembership draws a query of 1..maxBlocks sequence hashes, a
// verification window, and for a random set of ready lanes a membership
// around a depth (shared by every lane, so the shared window pass runs, or
// one per lane) with up to 30% of positions flipped: monotone or not.
func drawMembership(rt *rapid.T, maxBlocks int) (window int, seq []uint64, member [lanes][]bool) {
	n := rapid.IntRange(1, maxBlocks).Draw(rt, "n")
	window = rapid.IntRange(1, MaxVerificationWindow).Draw(rt, "window")
	seq = make([]uint64, n)
	for i := range seq {
		seq[i] = rapid.Uint64().Draw(rt, "hash") + uint64(i)*0x9E3779B97F4A7C15
	}
	ready := rapid.Uint16Range(1, 0xFFFF).Draw(rt, "ready")
	shared := rapid.IntRange(-1, n).Draw(rt, "sharedDepth") // -1: each lane draws its own
	for l := range lanes {
		if ready&(1<<l) == 0 {
			continue
		}
		member[l] = make([]bool, n)
		d := shared
		if d < 0 {
			d = rapid.IntRange(0, n).Draw(rt, fmt.Sprintf("depth%d", l))
		}
		noise := rapid.IntRange(0, 30).Draw(rt, "noise") // % of flipped positions
		for p := range n {
			member[l][p] = (p < d) != (rapid.IntRange(0, 99).Draw(rt, "flip") < noise)
		}
	}
	return window, seq, member
}
