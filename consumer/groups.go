package consumer

import (
	"math/bits"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// group is one format group (SPEC §8.1): the lanes whose current format is
// the same share one lane-minor table whose rows are width words wide, the
// group's lane count rounded up to 1, 2, 4, 8 or 16. A probe reads two rows
// of width words; a consumer with one group of 16 identity slots (every
// version-1 manifest) is exactly the 16-wide table of before, and queries
// run the same kernel (Consumer.uniform).
type group struct {
	format      ckf.Format
	addresser   ckf.Addresser
	bucketCount uint64
	width       int
	// words is the table, len bucketCount*width: bucket b of slot s at
	// b*width+s.
	words []uint64
	// members has bit l set for each lane in the group; slotLane[s] is the
	// lane of slot s, -1 when free.
	members  uint16
	slotLane [ckf.MaxLanes]int8
	// maps[0] and maps[1] map a slot hit mask to its lanes, a byte at a
	// time (kept by remap), so a probe maps a group's hits with two loads.
	maps [2][256]uint16
	// fixed: the version-1 table (slot l is lane l, 16 wide), never resized.
	fixed bool
}

func newGroup(f ckf.Format, width int) *group {
	g := &group{format: f, addresser: f.Addresser(), bucketCount: f.BucketCount, width: width,
		words: make([]uint64, f.BucketCount*uint64(width))}
	for s := range g.slotLane {
		g.slotLane[s] = -1
	}
	return g
}

// freeSlot returns a free slot below the group's width, or -1.
func (g *group) freeSlot() int {
	for s := range g.width {
		if g.slotLane[s] < 0 {
			return s
		}
	}
	return -1
}

// widen doubles the row width until it has a free slot, copying every
// member's column to the same slot of the wider rows.
func (g *group) widen() {
	w := g.width * 2
	words := make([]uint64, g.bucketCount*uint64(w))
	for s := range g.width {
		if g.slotLane[s] < 0 {
			continue
		}
		for b := range g.bucketCount {
			words[b*uint64(w)+uint64(s)] = g.words[b*uint64(g.width)+uint64(s)]
		}
	}
	g.words, g.width = words, w
}

// relayout rebuilds g with rows of w words, copying every lane's column:
// to the slot of its own index (byLane, w = 16), or to slots 0..n-1 in lane
// order.
func (c *Consumer) relayout(g *group, w int, byLane bool) {
	words := make([]uint64, g.bucketCount*uint64(w))
	var slotLane [ckf.MaxLanes]int8
	for s := range slotLane {
		slotLane[s] = -1
	}
	s := 0
	for m := g.members; m != 0; m &= m - 1 {
		li := bits.TrailingZeros16(m)
		if byLane {
			s = li
		}
		l := &c.lanes[li]
		for b := range g.bucketCount {
			words[b*uint64(w)+uint64(s)] = g.words[b*uint64(g.width)+uint64(l.slot)]
		}
		l.slot = s
		slotLane[s] = int8(li)
		s++
	}
	g.words, g.width, g.slotLane = words, w, slotLane
	g.remap()
}

// remap rebuilds lo and hi from slotLane.
func (g *group) remap() {
	for v := range 256 {
		var lo, hi uint16
		for s := range 8 {
			if v&(1<<s) == 0 {
				continue
			}
			if l := g.slotLane[s]; l >= 0 {
				lo |= 1 << uint(l)
			}
			if l := g.slotLane[s+8]; l >= 0 {
				hi |= 1 << uint(l)
			}
		}
		g.maps[0][v], g.maps[1][v] = lo, hi
	}
}

// join puts lane i in the group of format f, creating it (or widening it)
// as needed, after taking it out of its current group. A lane that already
// serves f keeps its group and slot. A group left empty is dropped: its
// table becomes garbage (in WebAssembly the Go heap reuses it; linear memory
// never shrinks).
func (c *Consumer) join(i int, f ckf.Format) {
	l := &c.lanes[i]
	if l.grp != nil && l.grp.format == f {
		return
	}
	c.leave(i)
	var g *group
	for _, cand := range c.groups {
		if cand.format == f {
			g = cand
			break
		}
	}
	if g == nil {
		w := 1
		if len(c.groups) == 0 {
			w = lanes // the only group: today's 16-lane table (shape)
		}
		g = newGroup(f, w)
		c.groups = append(c.groups, g)
	}
	s := g.freeSlot()
	if g.width == lanes && g.slotLane[i] < 0 {
		s = i // keep a 16-wide group's slots its lanes
	}
	for s < 0 {
		g.widen()
		s = g.freeSlot()
	}
	g.slotLane[s] = int8(i)
	g.members |= 1 << i
	g.remap()
	l.grp, l.slot = g, s
	if need := (f.BucketCount + 63) / 64; uint64(len(c.seen)) < need {
		c.seen = make([]uint64, need)
	}
	c.shape()
	c.regroup()
}

// shape keeps the layout rule: one group is today's 16-lane table (slot l is
// lane l, so queries take the one-table path and the WebAssembly search
// kernel); several groups have rows of their lane count rounded up to a
// power of two. It rebuilds (copying columns) only a group that breaks the
// rule, which happens only when a format group appears or disappears.
func (c *Consumer) shape() {
	if len(c.groups) == 1 {
		if g := c.groups[0]; !g.fixed && !g.identity() {
			c.relayout(g, lanes, true)
		}
		return
	}
	for _, g := range c.groups {
		if n := bits.OnesCount16(g.members); !g.fixed && g.width != rowWidth(n) {
			c.relayout(g, rowWidth(n), false)
		}
	}
}

// rowWidth is n lanes rounded up to 1, 2, 4, 8 or 16.
func rowWidth(n int) int {
	w := 1
	for w < n {
		w *= 2
	}
	return w
}

// identity reports whether g is 16 wide with every lane in the slot of its
// own index.
func (g *group) identity() bool {
	if g.width != lanes {
		return false
	}
	for s, l := range g.slotLane {
		if l >= 0 && int(l) != s {
			return false
		}
	}
	return true
}

// leave takes lane i out of its group; a group left empty is dropped (the
// caller then restores the layout rule: shape).
func (c *Consumer) leave(i int) {
	l := &c.lanes[i]
	g := l.grp
	if g == nil {
		return
	}
	g.slotLane[l.slot] = -1
	g.members &^= 1 << i
	g.remap()
	l.grp, l.slot = nil, 0
	if g.members == 0 {
		for k, cand := range c.groups {
			if cand == g {
				c.groups = append(c.groups[:k], c.groups[k+1:]...)
				break
			}
		}
	}
}

// regroup orders the groups by seed (so one key hash serves each run of
// groups with the same seed) and decides whether queries take the uniform
// path: one group of 16 slots where slot l is lane l, today's table.
func (c *Consumer) regroup() {
	gs := c.groups
	for i := 1; i < len(gs); i++ { // insertion sort: at most 16 groups
		for j := i; j > 0 && gs[j].format.Seed < gs[j-1].format.Seed; j-- {
			gs[j], gs[j-1] = gs[j-1], gs[j]
		}
	}
	// The probes' flattened copy of the groups (ckf.PrefixSearch.GroupHits,
	// and the WebAssembly search kernel's): rebuilt here, after every
	// change of a group's table, width, slots or members.
	c.q.kernel.ResetGroups()
	for _, g := range gs {
		c.q.kernel.AddGroup(g.addresser, g.words, g.width, &g.maps, g.members)
	}
	c.uniform = false
	c.words, c.addresser, c.bucketCount = nil, ckf.Addresser{}, 0
	if len(gs) != 1 || gs[0].width != lanes {
		return
	}
	for s, l := range gs[0].slotLane {
		if int(l) != s && l >= 0 {
			return
		}
	}
	g := gs[0]
	c.uniform = true
	c.words, c.addresser, c.bucketCount = g.words, g.addresser, g.bucketCount
}

// groupHits is rowHits for several groups: per group one probe of its two
// rows (width words each), its slot hits mapped to lanes; the key is hashed
// once per seed (groups are sorted by seed). It runs on regroup's flattened
// copy of the groups ([ckf.PrefixSearch.GroupHits]: one hand-written
// WebAssembly call in wasm builds). Loading every group's rows before
// testing any did not measure faster (docs/RATIONALE.md).
func (c *Consumer) groupHits(seqHash uint64, ready uint16) uint16 {
	return c.q.kernel.GroupHits(seqHash, ready)
}

// TableBytesAfterAssign returns the bytes of every group's table once lane
// i has been assigned format f (a lane index outside 0..15 counts as no
// lane), by the layout rule of shape. The WebAssembly module refuses an
// assignment past its table limit with it, before any table grows
// (docs/abi.md §5).
func (c *Consumer) TableBytesAfterAssign(i int, f ckf.Format) uint64 {
	var cur *group
	if i >= 0 && i < lanes {
		cur = c.lanes[i].grp
	}
	type after struct {
		buckets uint64
		n       int
		fixed   bool
	}
	var gs []after
	found := false
	for _, g := range c.groups {
		a := after{g.bucketCount, bits.OnesCount16(g.members), g.fixed}
		if cur == g && g.format != f {
			a.n--
		}
		if g.format == f {
			found = true
			if cur != g {
				a.n++
			}
		}
		if a.n > 0 || a.fixed {
			gs = append(gs, a)
		}
	}
	if !found {
		gs = append(gs, after{f.BucketCount, 1, false})
	}
	var total uint64
	for _, a := range gs {
		w := rowWidth(a.n)
		if a.fixed || len(gs) == 1 {
			w = lanes
		}
		total += a.buckets * uint64(w) * 8
	}
	return total
}
