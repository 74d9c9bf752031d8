package consumer

import (
	"math/bits"
	"runtime"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// querier holds the per-query scratch. It is reused across queries so that a
// query of a length already seen allocates nothing.
type querier struct {
	seq []uint64 // sequence hashes of the current query

	// memo[p] is the hit mask of position p, valid when stamp[p] == gen
	// (gen is even). Every position is probed at most once per query,
	// which bounds a query's probes by its length whatever the lanes hold.
	// With several format groups a probe reads only the groups of the
	// lanes the search needs at p (probeTable): then stamp[p] == gen|1
	// until every ready lane is answered there, and known[p] holds the
	// lanes memo[p] answers for.
	memo  []uint16
	stamp []uint32
	gen   uint32
	known []uint16

	probes  uint64 // lifetime probes
	queries uint64 // lifetime queries

	kernel ckf.PrefixSearch // the wasm search kernel's state, reused
}

// prepare sizes the scratch for n positions and starts a new memo
// generation; known only for a consumer of several format groups (a
// one-group query never reads it: 2 bytes a position it does not need).
func (q *querier) prepare(n int, groups bool) {
	if cap(q.memo) < n {
		q.memo = make([]uint16, n)
		q.stamp = make([]uint32, n)
		q.gen = 0
	}
	q.memo = q.memo[:n]
	q.stamp = q.stamp[:n]
	if groups {
		if cap(q.known) < n {
			q.known = make([]uint16, n)
		}
		q.known = q.known[:n]
	}
	q.gen += 2      // even: gen|1 marks a position partly answered
	if q.gen == 0 { // wrapped: old stamps could alias the new generation
		clear(q.stamp[:cap(q.stamp)])
		q.gen = 2
	}
}

// visited reports whether the current query has probed position p (for
// some lanes at least).
func (q *querier) visited(p int) bool { return q.stamp[p]|1 == q.gen|1 }

// rowHits returns, for the ready lanes, which hold seqHash. With one
// uniform group it is one probe of the same two rows (buckets a and b) for
// every lane, in one call ([ckf.Addresser.LaneRowHits]: hand-written
// WebAssembly in wasm builds), as before format groups; otherwise the OR of
// each group's probe ([Consumer.groupHits]).
func (c *Consumer) rowHits(seqHash uint64, ready uint16) uint16 {
	if c.uniform {
		return c.addresser.LaneRowHits(c.words, seqHash) & ready
	}
	return c.groupHits(seqHash, ready)
}

// probe returns the hit mask of position p of the current query for (at
// least) the ready lanes of need, probing the table once per position and
// query. It is small enough to inline, so a memo hit costs no call (a Go
// call is tens of nanoseconds in WebAssembly, and the window pass asks
// every lane about the same few positions). With several format groups the
// bits of lanes outside need may be 0 whatever the table holds
// (probeTable), so callers read only need's bits.
func (c *Consumer) probe(p int, need uint16) uint16 {
	if c.q.stamp[p] == c.q.gen {
		return c.q.memo[p]
	}
	return c.probeTable(p, need)
}

// probeTable is probe's first visit of p, or with several format groups a
// visit of a position not every ready lane was answered at. The first
// visit counts the probe, so a query's probes are its positions visited
// whatever the layout. With one group it reads the 16-wide rows once for
// every lane. With several it reads only the groups with a needed lane
// not answered at p yet ([ckf.PrefixSearch.GroupProbe]) and keeps the
// lanes answered in known: a binary search settling one lane reads its
// group's rows, not every group's (BENCHMARKS.md, "Format groups"). Every
// answer is the table's whichever probe read it, so results and probe
// counts are those of reading every group at each visit.
func (c *Consumer) probeTable(p int, need uint16) uint16 {
	q := &c.q
	ready := c.ready
	if c.uniform {
		q.probes++
		m := c.addresser.LaneRowHits(c.words, q.seq[p]) & ready
		q.memo[p] = m
		q.stamp[p] = q.gen
		return m
	}
	if q.stamp[p] != q.gen|1 { // first visit
		q.probes++
		q.memo[p], q.known[p] = 0, 0
	}
	if want := need & ready &^ q.known[p]; want != 0 {
		hits, covered := q.kernel.GroupProbe(q.seq[p], want)
		q.memo[p] |= hits & ready
		q.known[p] |= covered & ready
	}
	q.stamp[p] = q.gen
	if q.known[p] != ready {
		q.stamp[p] = q.gen | 1
	}
	return q.memo[p]
}

// span is a group of lanes known to hit at a and to miss at z (or z = n).
type span struct {
	lanes uint16
	a, z  int
}

// searchFast computes every ready lane's prefix depth over q.seq (SPEC §8.4):
// probe position 0; gallop at 1, 2, 4, 8 … while a lane hits; binary search
// between each lane's last hit and first miss; then re-check the W positions
// below each tentative depth, lowering the depth to the first miss, and
// rescan linearly from the last confirmed hit when that miss sits at the
// window's left edge. For a lane whose membership is monotone (a hit prefix,
// then only misses) the result equals [Consumer.searchLinear]. Cost: at most
// len(q.seq) probes.
//
// The binary search runs on groups of lanes, not on lanes: lanes that left
// the gallop at the same step share an interval, one probe at its midpoint
// serves the whole group (a probe reads all 16 lanes), and the group splits
// only where its lanes' answers differ. Each probe then costs O(1)
// bookkeeping instead of a pass over the lanes, which matters most in
// WebAssembly (BENCHMARKS.md, "Wasm kernels"). Every lane still follows its
// own binary-search path, so the positions probed (and the memo the window
// pass reads) are the union of those paths, whatever the order: the table
// does not change during a query.
func (c *Consumer) searchFast(ready uint16, depth *[lanes]uint32) {
	n := len(c.q.seq)
	var lo [lanes]int // a known hit, or -1
	for l := range lanes {
		lo[l] = -1
	}
	// Pending groups: disjoint and non-empty, so at most one per lane.
	var stack [lanes]span
	sp := 0
	// Gallop: every active lane has hit every sampled position so far; the
	// lanes that miss at p form the group (last, p).
	active := c.probe(0, ready)
	last := 0
	for p := 1; active != 0 && last < n-1; p *= 2 {
		if p > n-1 {
			p = n - 1
		}
		h := c.probe(p, active)
		if out := active &^ h; out != 0 {
			stack[sp] = span{out, last, p}
			sp++
		}
		active &= h
		last = p
	}
	if active != 0 {
		stack[sp] = span{active, last, n}
		sp++
	}
	// Grouped binary search. groups counts the final groups; when there is
	// one, every lane that hit position 0 has the same tentative depth.
	groups, shared := 0, span{}
	for sp > 0 {
		sp--
		g := stack[sp]
		for g.z-g.a > 1 {
			mid := g.a + (g.z-g.a)/2
			h := c.probe(mid, g.lanes)
			in, out := g.lanes&h, g.lanes&^h
			switch {
			case out == 0:
				g.a = mid
			case in == 0:
				g.z = mid
			default: // split: the missing lanes wait their turn
				stack[sp] = span{out, g.a, mid}
				sp++
				g.lanes, g.a = in, mid
			}
		}
		for m := g.lanes; m != 0; m &= m - 1 {
			lo[bits.TrailingZeros16(m)] = g.a
		}
		groups++
		shared = g
	}
	if groups == 1 {
		c.verifyShared(shared, ready, depth)
		return
	}
	c.verifyLanes(ready, &lo, ready, depth)
}

// verifyLanes is searchFast's verification window and provenance fallback,
// lane by lane in lane order, for the lanes of m (lo: each lane's last hit
// from the binary search, -1 for none).
func (c *Consumer) verifyLanes(m uint16, lo *[lanes]int, ready uint16, depth *[lanes]uint32) {
	w := c.window
	for ; m != 0; m &= m - 1 {
		l := bits.TrailingZeros16(m)
		t := lo[l] + 1 // tentative depth
		if t == 0 {
			depth[l] = 0
			continue
		}
		left := max(0, t-w)
		miss := -1
		for p := left; p < t; p++ {
			if c.probe(p, 1<<l)&(1<<l) == 0 {
				miss = p
				break
			}
		}
		depth[l] = uint32(c.settle(l, t, left, miss, ready))
	}
}

// hasSearchKernel: on GOARCH=wasm searchFast runs as one hand-written
// WebAssembly call ([ckf.Addresser.SearchPrefix]); Go's wasm code spends
// most of a sequence-hash query on the search's own bookkeeping
// (BENCHMARKS.md, "Wasm kernels"). Natively the constant removes the branch.
const hasSearchKernel = runtime.GOARCH == "wasm"

// useSearchKernel lets tests run the Go search in wasm builds too.
var useSearchKernel = true

// runKernel is runOn(seq, res, false) with searchFast run by the kernel,
// flattened into one function: in WebAssembly each Go call on the query
// path costs tens of nanoseconds (BENCHMARKS.md, "Wasm kernels"). It
// finishes in Go what the kernel leaves: the linear rescans of the
// provenance fallback (rare: a window miss at the window's left edge), in
// searchFast's lane order, so results and probes are the same.
func (c *Consumer) runKernel(seq []uint64, res *QueryResult) error {
	if !useSearchKernel {
		return c.runOn(seq, res, false)
	}
	if res == nil {
		return ErrInvalidQuery
	}
	ready := c.ready
	// *res = QueryResult{Mask: ready, Blocks: len(seq)} in stores of at
	// most 32 bytes: Go's wasm code zeroes anything larger with
	// memory.fill, which wazero runs as a loop of memmove calls
	// (BENCHMARKS.md, "Wasm kernels").
	*(*[lanes / 2]uint32)(res.Depths[:lanes/2]) = [lanes / 2]uint32{}
	*(*[lanes / 2]uint32)(res.Depths[lanes/2:]) = [lanes / 2]uint32{}
	res.Mask, res.Blocks, res.Probes = ready, len(seq), 0
	q := &c.q
	q.queries++
	if ready == 0 {
		return ErrUnavailable
	}
	if len(seq) == 0 {
		return nil
	}
	q.prepare(len(seq), !c.uniform)
	before := q.probes
	s := &q.kernel
	s.Seq, s.Memo, s.Stamp, s.Gen = seq, q.memo, q.stamp, q.gen
	s.Ready, s.Window, s.Depth = ready, c.window, &res.Depths
	var ok bool
	if c.uniform {
		ok = c.addresser.SearchPrefix(c.words, s) // today's kernel, one 16-wide table
	} else {
		s.Known = q.known
		ok = s.SearchGroups() // several format groups (regroup added them)
	}
	if !ok {
		panic("consumer: search kernel missing or refused its input")
	}
	s.Seq, s.Depth = nil, nil // not retained: seq is the caller's
	q.probes += uint64(s.Probes)
	if s.Fallback != 0 || s.Resume >= 0 {
		saved := q.seq
		q.seq = seq
		c.finishKernel(ready, &res.Depths)
		q.seq = saved
	}
	res.Probes = int(q.probes - before)
	return nil
}

// finishKernel runs the fallbacks the kernel left to Go (q.seq is the
// query's).
func (c *Consumer) finishKernel(ready uint16, depth *[lanes]uint32) {
	s := &c.q.kernel
	if s.Fallback != 0 {
		for m := s.Fallback; m != 0; m &= m - 1 {
			l := bits.TrailingZeros16(m)
			depth[l] = uint32(c.settle(l, s.T, s.Left, s.Left, ready))
		}
		return
	}
	c.verifyLanes(ready&^(1<<s.Resume-1), &s.Lo, ready, depth)
}

// verifyShared is the window pass when every lane that hit position 0 (the
// lanes of g) has the same tentative depth g.a+1: one scan of the window
// finds each lane's first miss in it, instead of one scan per lane. It is
// exact: the window's positions are all ≥ its left edge and a fallback only
// reads positions below it, so running the windows before the fallbacks
// (still in lane order) leaves every fallback's input as it was. Lanes not
// in g missed position 0 and keep depth 0.
func (c *Consumer) verifyShared(g span, ready uint16, depth *[lanes]uint32) {
	t := g.a + 1
	left := max(0, t-c.window)
	var miss [lanes]int
	pending := g.lanes
	for p := left; p < t && pending != 0; p++ {
		h := c.probe(p, pending)
		for m := pending &^ h; m != 0; m &= m - 1 {
			miss[bits.TrailingZeros16(m)] = p
		}
		pending &= h
	}
	for m := pending; m != 0; m &= m - 1 {
		depth[bits.TrailingZeros16(m)] = uint32(t)
	}
	for m := g.lanes &^ pending; m != 0; m &= m - 1 {
		l := bits.TrailingZeros16(m)
		depth[l] = uint32(c.settle(l, t, left, miss[l], ready))
	}
}

// settle turns lane l's window result into its depth: t when the window
// [left, t) held no miss (miss < 0), the miss otherwise, and when the miss
// sits at the window's left edge (it may extend below the window) a linear
// rescan from the last position this query confirmed as a hit for the lane.
func (c *Consumer) settle(l, t, left, miss int, ready uint16) int {
	switch {
	case miss < 0:
		return t
	case miss == left && left > 0:
		from := 0
		for p := left - 1; p >= 0; p-- {
			// A visited position answers for every lane (probe reads
			// the lane's group there if no probe needed it yet).
			if c.q.visited(p) && c.probe(p, 1<<l)&(1<<l) != 0 {
				from = p + 1
				break
			}
		}
		t = from
		for t < miss && c.probe(t, 1<<l)&(1<<l) != 0 {
			t++
		}
		return t
	default:
		return miss
	}
}

// searchLinear is the exact reference of SPEC §8.4: for every ready lane, the
// number of leading positions that hit, stopping at the lane's first miss.
// Cost: up to len(q.seq) probes.
func (c *Consumer) searchLinear(ready uint16, depth *[lanes]uint32) {
	open := ready
	for p := 0; p < len(c.q.seq) && open != 0; p++ {
		h := c.probe(p, open)
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
