package e2e

// The checks: faults and stats against the model, the mirror against the
// shadow, the lane against the mirror, and queries against every chain.

import (
	"fmt"
	"math/bits"
	"slices"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/producer"
)

// checkFaults compares the faults the actor reported with the model's.
// When closed is set the actor has stopped and the channel is read to its end.
func (p *pool) checkFaults(closed bool) {
	t := p.r.t
	t.Helper()
	var got []producer.Fault
	for {
		var f producer.Fault
		var ok bool
		if closed {
			f, ok = <-p.faults
		} else {
			select {
			case f, ok = <-p.faults:
			default:
			}
		}
		if !ok {
			break
		}
		got = append(got, f)
	}
	require.Len(t, got, len(p.wantFaults), "pool %d: got %d faults %v, want %d %v", p.idx, len(got), got, len(p.wantFaults), p.wantFaults)
	for i, f := range got {
		require.ErrorIs(t, f.Err, p.wantFaults[i], "pool %d: fault %d: %v", p.idx, i, f)
	}
	p.wantFaults = p.wantFaults[:0]
}

// checkStats compares the actor's view with the shadow and the model.
func (p *pool) checkStats(st producer.ActorStats) {
	t := p.r.t
	t.Helper()
	sh := p.shadow.Stats()
	type agg struct {
		Members                                                     int
		Contributions                                               uint64
		UniqueBlocks                                                int
		ResidentBlocks, UnknownRemovals, ParentNotFound, CapFailure uint64
		OccupiedBuckets, OccupiedSlots                              int
	}
	of := func(s ckf.Stats) agg {
		return agg{s.Members, s.Contributions, s.UniqueBlocks, s.ResidentBlocks, s.UnknownRemovals,
			s.ParentNotFound, s.CapacityFailures, s.OccupiedBuckets, s.OccupiedSlots}
	}
	require.Equal(t, of(sh), of(st.Pool), "pool %d: actor pool stats %+v, shadow %+v", p.idx, of(st.Pool), of(sh))
	// The model's ownership, independently of ckf.
	var want []ckf.MemberCount
	owners := map[uint64]uint32{}
	var contributions uint64
	for _, m := range p.members {
		if len(m.held) > 0 {
			want = append(want, ckf.MemberCount{Member: m.id, Blocks: len(m.held)})
		}
		for _, b := range m.held {
			owners[b.canon]++
			contributions++
		}
	}
	slices.SortFunc(want, func(a, b ckf.MemberCount) int { return a.Member.Compare(b.Member) })
	if !slices.Equal(st.Members, want) {
		require.Equal(t, want, st.Members, "pool %d: actor members (want the model's)", p.idx)
	}
	require.Equal(t, contributions, st.Pool.Contributions, "pool %d: actor contributions (want the model's)", p.idx)
	require.Equal(t, len(owners), st.Pool.UniqueBlocks, "pool %d: actor unique blocks (want the model's)", p.idx)
	for c, n := range owners {
		got, _ := p.shadow.Owners(c)
		require.Equal(t, n, got, "pool %d: shadow owners of %#x = %d, model %d", p.idx, c, got, n)
	}
	require.Equal(t, int(st.Pool.ResidentBlocks), st.Pool.OccupiedSlots, "pool %d: %d occupied slots for %d resident blocks", p.idx, st.Pool.OccupiedSlots, st.Pool.ResidentBlocks)
	require.Equal(t, p.wantStale, st.StaleEventsDropped, "pool %d: actor stale events (want the model's)", p.idx)
	require.Equal(t, p.wantUnknownEvents, st.UnknownRemovalEvents, "pool %d: actor unknown-removal events (want the model's)", p.idx)
	require.Equal(t, p.wantCapacityEvents, st.CapacityOmissionEvents, "pool %d: actor capacity-omission events (want the model's)", p.idx)
	require.Equal(t, p.wantDegraded, st.DegradedResets, "pool %d: actor degraded resets (want the model's)", p.idx)
	require.Zero(t, st.PublishFailures, "pool %d: publish failures", p.idx)
	require.Equal(t, producer.NotFenced, st.Fence, "pool %d: fence", p.idx)
}

// checkpoint brings the lane up to date and compares it with the producer:
// flush, forward, heartbeat at the producer's last sequence, then mirror ==
// shadow and lane == mirror. A lost delta is detected by now (gap or
// heartbeat) and recovered by a new lease; resub forces a new lease anyway.
func (p *pool) checkpoint(resub bool) {
	t := p.r.t
	t.Helper()
	p.flush()
	p.pump()
	st, err := p.h.Stats(p.r.ctx)
	require.NoError(t, err, "pool %d: Stats", p.idx)
	require.Equal(t, p.lastSeq, st.Sequence, "pool %d: actor sequence (want the stream's)", p.idx)
	require.True(t, st.HasLease, "pool %d: actor has a lease", p.idx)
	require.Equal(t, p.lease, st.Lease, "pool %d: actor lease (want the stream's)", p.idx)
	p.checkFaults(false)
	p.checkStats(st)
	p.heartbeat(st.Sequence)
	p.compare(st.Pool.ResidentBlocks)
	if resub || p.lost {
		require.False(t, p.lost && !p.deactivated, "pool %d: a lost delta went unnoticed past a heartbeat", p.idx)
		p.resubscribe()
	}
}

// compare checks mirror == shadow, and lane == mirror when the lane is
// healthy; resident is the actor's resident block count, which must equal
// the lane's occupied slots.
func (p *pool) compare(resident uint64) {
	t := p.r.t
	t.Helper()
	if sw := p.shadow.Words(); !slices.Equal(p.mirror, sw) {
		require.Fail(t, fmt.Sprintf("pool %d: the producer's stream differs from the shadow pool in %s", p.idx, diffWords(p.mirror, sw)))
	}
	st := p.laneStatus()
	if !p.healthy() {
		require.False(t, st.Ready, "pool %d: lane %d ready after a lost delta", p.idx, p.lane)
		return
	}
	require.True(t, st.Ready, "pool %d: lane ready", p.idx)
	require.Equal(t, p.lastSeq, st.InstalledSequence, "pool %d: lane sequence", p.idx)
	w := p.laneWords()
	if !slices.Equal(w, p.mirror) {
		require.Fail(t, fmt.Sprintf("pool %d: lane %d differs from the producer's table in %s", p.idx, p.lane, diffWords(w, p.mirror)))
	}
	n := occupiedSlots(w)
	require.Equal(t, resident, uint64(n), "pool %d: lane holds %d fingerprints, producer %d resident blocks", p.idx, n, resident)
}

// checkQueries asks the consumer for every chain a member holds: where the
// producer holds the whole chain resident the lane must report exactly its
// length (the query is that long, so no false positive can add to it),
// and a resident prefix must never be under-reported, by the fast search or
// the linear reference, even when a suffix of random blocks follows it.
// Every resident canonical hash must be in Contains' mask.
func (r *rig) checkQueries() {
	t := r.t
	t.Helper()
	got := r.cons.ReadyMask() &^ r.hostileMask()
	require.Equal(t, r.laneMask, got, "ready mask %#x, want %#x", got, r.laneMask)
	chains := map[uint64][]uint64{}
	for _, p := range r.pools {
		for _, m := range p.members {
			for _, b := range m.held {
				chains[b.canon] = b.path
			}
		}
	}
	leaves := make([]uint64, 0, len(chains))
	for c := range chains {
		leaves = append(leaves, c)
	}
	slices.Sort(leaves)
	var fast, lin consumer.QueryResult
	for _, leaf := range leaves {
		path := chains[leaf]
		ext := append(slices.Clip(path), ckf.ChainHash(leaf, 0xe2e1), ckf.ChainHash(ckf.ChainHash(leaf, 0xe2e1), 0xe2e2))
		for _, q := range [][]uint64{path, ext} {
			require.NoError(t, r.cons.QuerySequenceHashes(q, &fast), "QuerySequenceHashes")
			require.NoError(t, r.cons.QuerySequenceHashesLinear(q, &lin), "QuerySequenceHashesLinear")
			r.queries++
			require.Equal(t, r.laneMask, fast.Mask&^r.hostileMask(), "fast query mask")
			require.Equal(t, r.laneMask, lin.Mask&^r.hostileMask(), "linear query mask")
			for _, p := range r.pools {
				resident := 0
				for _, c := range path {
					if _, ok := p.shadow.Owners(c); !ok {
						break
					}
					resident++
				}
				df, dl := int(fast.Depths[p.lane]), int(lin.Depths[p.lane])
				require.GreaterOrEqual(t, df, resident, "pool %d lane %d: chain of %d blocks (query %d) with %d resident: fast depth %d, linear %d (false negative)", p.idx, p.lane, len(path), len(q), resident, df, dl)
				require.GreaterOrEqual(t, dl, resident, "pool %d lane %d: chain of %d blocks (query %d) with %d resident: fast depth %d, linear %d (false negative)", p.idx, p.lane, len(path), len(q), resident, df, dl)
				if len(q) == len(path) && resident == len(path) {
					r.fullChains++
					require.Len(t, path, df, "pool %d lane %d: fully resident chain of %d: fast depth %d, linear %d", p.idx, p.lane, len(path), df, dl)
					require.Len(t, path, dl, "pool %d lane %d: fully resident chain of %d: fast depth %d, linear %d", p.idx, p.lane, len(path), df, dl)
				} else if len(q) == len(path) && resident > 0 {
					r.partialChains++
				}
			}
		}
	}
	for _, p := range r.pools {
		for _, m := range p.members {
			for _, b := range m.held {
				if _, res := p.shadow.Owners(b.canon); !res {
					continue
				}
				mask, err := r.cons.Contains(b.canon)
				require.NoError(t, err, "pool %d: Contains(%#x)", p.idx, b.canon)
				require.NotZero(t, mask&(1<<p.lane), "pool %d: resident %#x not in lane %d: mask %#x", p.idx, b.canon, p.lane, mask)
			}
		}
	}
}

// checkpoint runs a checkpoint on every pool (kind per pool: 0 check, 1 new
// lease, 2 restart) and then the query checks over all lanes.
func (r *rig) checkpoint(kinds []int) {
	r.t.Helper()
	for i, p := range r.pools {
		switch kinds[i] {
		case 0:
			p.checkpoint(false)
		case 1:
			p.checkpoint(true)
		case 2:
			p.restart()
		}
	}
	r.checkpoints++
	r.checkQueries()
}

// occupiedSlots counts the non-zero 16-bit slots of words.
func occupiedSlots(words []uint64) int {
	n := 0
	for _, w := range words {
		for i := range 4 {
			if w>>(16*i)&0xffff != 0 {
				n++
			}
		}
	}
	return n
}

// diffWords describes where two tables differ.
func diffWords(got, want []uint64) string {
	if len(got) != len(want) {
		return fmt.Sprintf("length: got %d words, want %d", len(got), len(want))
	}
	n, first := 0, -1
	for i := range got {
		if got[i] != want[i] {
			if first < 0 {
				first = i
			}
			n++
		}
	}
	if first < 0 {
		return "no bucket"
	}
	return fmt.Sprintf("%d buckets; first bucket %d: got %#016x, want %#016x (%d bits differ)",
		n, first, got[first], want[first], bits.OnesCount64(got[first]^want[first]))
}
