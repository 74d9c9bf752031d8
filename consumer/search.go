package consumer

import (
	"math/bits"
)

// querier holds the per-query scratch. It is reused across queries so that a
// query of a length already seen allocates nothing.
type querier struct {
	seq []uint64 // sequence hashes of the current query

	// memo[p] is the hit mask of position p, valid when stamp[p] == gen.
	// Every position is probed at most once per query, which bounds a
	// query's probes by its length whatever the lanes hold.
	memo  []uint16
	stamp []uint32
	gen   uint32

	probes  uint64 // lifetime probes
	queries uint64 // lifetime queries
}

// prepare sizes the scratch for n positions and starts a new memo generation.
func (q *querier) prepare(n int) {
	if cap(q.memo) < n {
		q.memo = make([]uint16, n)
		q.stamp = make([]uint32, n)
		q.gen = 0
	}
	q.memo = q.memo[:n]
	q.stamp = q.stamp[:n]
	q.gen++
	if q.gen == 0 { // wrapped: old stamps could alias the new generation
		clear(q.stamp[:cap(q.stamp)])
		q.gen = 1
	}
}

// rowHits returns, for the ready lanes, which hold seqHash: one probe of the
// same two rows (buckets a and b) for every lane, in one call
// ([ckf.Addresser.LaneRowHits]: hand-written WebAssembly in wasm builds).
func (c *Consumer) rowHits(seqHash uint64, ready uint16) uint16 {
	return c.addresser.LaneRowHits(c.words, seqHash) & ready
}

// probe returns the hit mask of position p of the current query, probing the
// table once per position and query.
func (c *Consumer) probe(p int, ready uint16) uint16 {
	q := &c.q
	if q.stamp[p] == q.gen {
		return q.memo[p]
	}
	q.probes++
	m := c.rowHits(q.seq[p], ready)
	q.memo[p] = m
	q.stamp[p] = q.gen
	return m
}

// searchFast computes every ready lane's prefix depth over q.seq (SPEC §8.4):
// probe position 0; gallop at 1, 2, 4, 8 … while a lane hits; grouped binary
// search per level between each lane's last hit and first miss (lanes whose
// midpoints coincide share one probe, and one probe serves all 16 lanes
// anyway); then re-check the W positions below each tentative depth, lowering
// the depth to the first miss, and rescan linearly from the last confirmed
// hit when that miss sits at the window's left edge. For a lane whose
// membership is monotone (a hit prefix, then only misses) the result equals
// [Consumer.searchLinear]. Cost: at most len(q.seq) probes.
func (c *Consumer) searchFast(ready uint16, depth *[lanes]uint32) {
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

// searchLinear is the exact reference of SPEC §8.4: for every ready lane, the
// number of leading positions that hit, stopping at the lane's first miss.
// Cost: up to len(q.seq) probes.
func (c *Consumer) searchLinear(ready uint16, depth *[lanes]uint32) {
	open := ready
	for p := 0; p < len(c.q.seq) && open != 0; p++ {
		h := c.probe(p, ready)
		for m := open &^ h; m != 0; m &= m - 1 {
			l := bits.TrailingZeros16(m)
			depth[l] = uint32(p)
		}
		open &= h
	}
	for m := open; m != 0; m &= m - 1 {
		depth[bits.TrailingZeros16(m)] = uint32(len(c.q.seq))
	}
}
