package ckf

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	mA = Member{WorkerID: 1, DPRank: 0}
	mB = Member{WorkerID: 2, DPRank: 0}
	mC = Member{WorkerID: 1, DPRank: 1} // sibling rank of mA
)

func TestPool_StoreAndRemovePublishesImages(t *testing.T) {
	p := newTestPool(t, 1000, 1, DefaultMaxKicks)
	consumer := make([]uint64, p.Format().BucketCount)
	c := chain(10, 11, 12)
	out := p.ApplyEvent(rootEv(mA, b(100, 10), b(101, 11), b(102, 12)))
	require.NoError(t, out.FirstError, "store outcome = %+v, want no error, a boundary and a batch", out)
	require.True(t, out.PublicationBoundary, "store outcome = %+v, want no error, a boundary and a batch", out)
	require.NotNil(t, out.Batch, "store outcome = %+v, want no error, a boundary and a batch", out)
	checkBatch(t, out.Batch, p.Format().BucketCount)
	applyBatch(consumer, out.Batch)
	for i, h := range c {
		owners, res := p.Owners(h)
		assert.False(t, owners != 1 || !res, "Owners(block %d) = %d, %v; want 1, true", i, owners, res)
		assert.True(t, p.Contains(h), "Contains(block %d) = false, want true", i)
	}
	require.True(t, slices.Equal(consumer, p.Words()), "consumer after store batch differs from producer words")
	out = p.ApplyEvent(removedEv(mA, 100, 101, 102))
	require.NoError(t, out.FirstError, "remove outcome = %+v, want a batch and no error", out)
	require.NotNil(t, out.Batch, "remove outcome = %+v, want a batch and no error", out)
	require.Equal(t, 0, out.UnknownRemovals, "remove outcome = %+v, want a batch and no error", out)
	for _, im := range out.Batch.Images {
		assert.Equal(t, uint64(0), im.Word, "final removal image for bucket %d = %#x, want explicit zero", im.Bucket, im.Word)
	}
	applyBatch(consumer, out.Batch)
	require.True(t, slices.Equal(consumer, p.Words()), "consumer after remove batch is not the all-zero producer table")
	require.False(t, slices.ContainsFunc(consumer, func(w uint64) bool { return w != 0 }), "consumer after remove batch is not the all-zero producer table")
	s := p.Stats()
	require.Equal(t, 0, s.Members, "stats after removing everything = %+v, want empty aggregation", s)
	require.Equal(t, 0, s.UniqueBlocks, "stats after removing everything = %+v, want empty aggregation", s)
	require.Equal(t, uint64(0), s.Contributions, "stats after removing everything = %+v, want empty aggregation", s)
	require.Equal(t, uint64(0), s.ResidentBlocks, "stats after removing everything = %+v, want empty aggregation", s)
}

func TestPool_SharedOwnershipSurvivesNonFinalRemoval(t *testing.T) {
	p := newTestPool(t, 1000, 1, DefaultMaxKicks)
	k := chain(5)[0]
	p.ApplyEvent(rootEv(mA, b(1, 5)))
	out := p.ApplyEvent(rootEv(mB, b(2, 5))) // same tokens, another member
	require.Nil(t, out.Batch, "second owner published %+v, want nothing (only the 0→1 owner inserts)", out.Batch)
	owners, _ := p.Owners(k)
	require.Equal(t, uint32(2), owners, "owners = %d, want 2", owners)
	s := p.Stats()
	require.Equal(t, 1, s.OccupiedSlots, "stats = %+v, want 1 slot, 2 contributions, 1 unique block", s)
	require.Equal(t, uint64(2), s.Contributions, "stats = %+v, want 1 slot, 2 contributions, 1 unique block", s)
	require.Equal(t, 1, s.UniqueBlocks, "stats = %+v, want 1 slot, 2 contributions, 1 unique block", s)
	out = p.ApplyEvent(removedEv(mA, 1))
	require.Nil(t, out.Batch, "non-final removal outcome = %+v, want no batch, no error", out)
	require.NoError(t, out.FirstError, "non-final removal outcome = %+v, want no batch, no error", out)
	owners, res := p.Owners(k)
	require.Equal(t, uint32(1), owners, "after non-final removal Owners = %d, %v, Contains = %v; want 1, true, true", owners, res, p.Contains(k))
	require.True(t, res, "after non-final removal Owners = %d, %v, Contains = %v; want 1, true, true", owners, res, p.Contains(k))
	require.True(t, p.Contains(k), "after non-final removal Owners = %d, %v, Contains = %v; want 1, true, true", owners, res, p.Contains(k))
	out = p.ApplyEvent(removedEv(mB, 2))
	require.NotNil(t, out.Batch, "final removal: batch %+v, Contains %v; want a zero image and absent", out.Batch, p.Contains(k))
	require.False(t, p.Contains(k), "final removal: batch %+v, Contains %v; want a zero image and absent", out.Batch, p.Contains(k))
}

func TestPool_ClearKeepsSiblingRanks(t *testing.T) {
	p := newTestPool(t, 1000, 1, DefaultMaxKicks)
	p.ApplyEvent(rootEv(mA, b(1, 10), b(2, 11)))
	p.ApplyEvent(rootEv(mC, b(1, 20))) // same worker, rank 1, same external hash 1
	p.ApplyEvent(rootEv(mC, b(3, 10))) // shares canonical 10 with mA
	out := p.ApplyEvent(clearedEv(mA))
	require.NoError(t, out.FirstError, "clear error")
	got, want := p.MemberCounts(), []MemberCount{{mC, 2}}
	require.True(t, slices.Equal(got, want), "MemberCounts after clearing rank 0 = %+v, want %+v", got, want)
	c10, c11, c20 := chain(10)[0], chain(10, 11)[1], chain(20)[0]
	for _, tc := range []struct {
		name   string
		h      uint64
		owners uint32
	}{{"shared root", c10, 1}, {"rank 0 only", c11, 0}, {"rank 1 only", c20, 1}} {
		owners, _ := p.Owners(tc.h)
		assert.Equal(t, tc.owners, owners, "%s: owners = %d, want %d", tc.name, owners, tc.owners)
	}
	assert.False(t, p.Contains(c11) && p.Stats().OccupiedSlots != 2, "occupied slots = %d, want 2", p.Stats().OccupiedSlots)
	// Rank 1 can still remove by its own external hash 1.
	{
		out := p.ApplyEvent(removedEv(mC, 1))
		require.Equal(t, 0, out.UnknownRemovals, "sibling removal counted %d unknown, want 0", out.UnknownRemovals)
	}
}

func TestPool_TierFiltering(t *testing.T) {
	p := newTestPool(t, 1000, 2, DefaultMaxKicks)
	for _, tier := range []StorageTier{TierHostPinned, TierDisk, TierExternal} {
		out := p.ApplyEvent(onTier(rootEv(mA, b(1, 10)), tier))
		require.False(t, out != (ApplyOutcome{}), "%v store outcome = %+v, want zero (ignored)", tier, out)
		out = p.ApplyEvent(onTier(removedEv(mA, 99), tier))
		require.False(t, out != (ApplyOutcome{}), "%v unknown removal outcome = %+v, want zero (ignored, not counted)", tier, out)
	}
	require.Equal(t, uint64(0), p.PendingEventCount(), "non-device events changed state: pending %d, stats %+v", p.PendingEventCount(), p.Stats())
	require.Equal(t, 0, p.Stats().Members, "non-device events changed state: pending %d, stats %+v", p.PendingEventCount(), p.Stats())
	require.Equal(t, uint64(0), p.Stats().UnknownRemovals, "non-device events changed state: pending %d, stats %+v", p.PendingEventCount(), p.Stats())
	out := p.ApplyEvent(removedEv(mA, 99, 98))
	require.Equal(t, 2, out.UnknownRemovals, "device unknown removal: outcome %+v, stats unknown %d, pending %d; want 2 counted, 1 pending", out, p.Stats().UnknownRemovals, p.PendingEventCount())
	require.NoError(t, out.FirstError, "device unknown removal: outcome %+v, stats unknown %d, pending %d; want 2 counted, 1 pending", out, p.Stats().UnknownRemovals, p.PendingEventCount())
	require.Equal(t, uint64(2), p.Stats().UnknownRemovals, "device unknown removal: outcome %+v, stats unknown %d, pending %d; want 2 counted, 1 pending", out, p.Stats().UnknownRemovals, p.PendingEventCount())
	require.Equal(t, uint64(1), p.PendingEventCount(), "device unknown removal: outcome %+v, stats unknown %d, pending %d; want 2 counted, 1 pending", out, p.Stats().UnknownRemovals, p.PendingEventCount())
	// Cleared from a non-device tier still clears the member's device state.
	p.ApplyEvent(rootEv(mA, b(1, 10)))
	require.Equal(t, 1, p.Stats().Members, "device store did not apply")
	require.False(t, !p.HasPendingPublication() && p.PendingEventCount() != 0, "pending = %d after the boundary, want 0", p.PendingEventCount())
	p.ApplyEvent(onTier(clearedEv(mA), TierDisk))
	require.Equal(t, 0, p.Stats().Members, "disk-tier clear left members=%d, contains=%v; want cleared", p.Stats().Members, p.Contains(chain(10)[0]))
	require.False(t, p.Contains(chain(10)[0]), "disk-tier clear left members=%d, contains=%v; want cleared", p.Stats().Members, p.Contains(chain(10)[0]))
	require.Equal(t, uint64(1), p.PendingEventCount(), "PendingEventCount after a disk-tier clear = %d, want 1 (it is admitted)", p.PendingEventCount())
}

func TestPool_MalformedEventsChangeNothing(t *testing.T) {
	cases := []struct {
		name string
		ev   *RouterEvent
		want error
	}{
		{"nil event", nil, ErrMalformedEvent},
		{"zero kind", &RouterEvent{WorkerID: 1}, ErrMalformedEvent},
		{"unknown kind", &RouterEvent{WorkerID: 1, Kind: 9}, ErrMalformedEvent},
		{"unknown tier", onTier(rootEv(mA, b(1, 1)), 7), ErrUnsupportedResidencyDomain},
		{"unknown tier clear", onTier(clearedEv(mA), 200), ErrUnsupportedResidencyDomain},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPool(t, 100, 5, DefaultMaxKicks)
			p.ApplyEvent(rootEv(mA, b(5, 5)))
			before := viewOf(p)
			out := p.ApplyEvent(tc.ev)
			require.ErrorIs(t, out.FirstError, tc.want, "FirstError = %v, want %v", out.FirstError, tc.want)
			require.Nil(t, out.Batch, "outcome = %+v, want no batch and no boundary", out)
			require.False(t, out.PublicationBoundary, "outcome = %+v, want no batch and no boundary", out)
			after := viewOf(p)
			require.True(t, after.equal(before), "state changed: before %+v, after %+v", before, after)
		})
	}
}

// TestPool_RejectedStoredCommitsNothing covers SPEC §4.3 whole-event
// validation: on ParentBlockNotFound or InvalidBlockSequence no block of the
// event commits, not even the ones before the bad one.
func TestPool_RejectedStoredCommitsNothing(t *testing.T) {
	many := func(n int, dupAt int) []StoredBlock { // n blocks, the last repeating block dupAt's external hash
		out := make([]StoredBlock, n)
		for i := range out {
			out[i] = b(uint64(1000+i), uint64(5000+i))
		}
		out[n-1].BlockHash = out[dupAt].BlockHash
		return out
	}
	withStart := func(ev *RouterEvent, pos uint32) *RouterEvent {
		ev.HasStartPosition, ev.StartPosition = true, pos
		return ev
	}
	cases := []struct {
		name  string
		ev    *RouterEvent
		want  error
		block uint64
	}{
		{"unknown parent", childEv(mA, 77, b(20, 20), b(21, 21)), ErrParentBlockNotFound, 77},
		{"parent of another member", childEv(mB, 1, b(20, 20)), ErrParentBlockNotFound, 1},
		{"root with start_position > 0", withStart(rootEv(mA, b(20, 20), b(21, 21)), 16), ErrInvalidBlockSequence, 20},
		{"remapped external hash", rootEv(mA, b(20, 20), b(2, 99)), ErrInvalidBlockSequence, 2},
		{"remapped root external hash", rootEv(mA, b(1, 99)), ErrInvalidBlockSequence, 1},
		{"duplicate external hash", rootEv(mA, b(20, 20), b(21, 21), b(20, 22)), ErrInvalidBlockSequence, 20},
		{"duplicate in a long event", rootEv(mA, many(40, 3)...), ErrInvalidBlockSequence, 1003},
		{"duplicate at the end of 17", rootEv(mA, many(17, 0)...), ErrInvalidBlockSequence, 1000},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPool(t, 1000, 1, DefaultMaxKicks)
			p.ApplyEvent(rootEv(mA, b(1, 10), b(2, 11)))
			before := viewOf(p)
			out := p.ApplyEvent(tc.ev)
			require.ErrorIs(t, out.FirstError, tc.want, "FirstError = %v, want %v", out.FirstError, tc.want)
			var ee *EventError
			require.ErrorAs(t, out.FirstError, &ee, "EventError = %+v, want block %#x of member %+v", ee, tc.block, tc.ev.Member())
			require.Equal(t, tc.block, ee.BlockHash, "EventError = %+v, want block %#x of member %+v", ee, tc.block, tc.ev.Member())
			require.Equal(t, tc.ev.Member(), ee.Member, "EventError = %+v, want block %#x of member %+v", ee, tc.block, tc.ev.Member())
			require.Nil(t, out.Batch, "rejected event published %+v", out.Batch)
			after := viewOf(p)
			wantStats := before.stats
			if tc.want == ErrParentBlockNotFound {
				wantStats.ParentNotFound++
			}
			require.True(t, slices.Equal(after.words, before.words), "rejected event changed state:\n before %+v\n after  %+v", before, after)
			require.True(t, slices.Equal(after.counts, before.counts), "rejected event changed state:\n before %+v\n after  %+v", before, after)
			require.Equal(t, wantStats, after.stats, "rejected event changed state:\n before %+v\n after  %+v", before, after)
			for _, blk := range tc.ev.Blocks {
				owners, _ := p.Owners(blk.TokensHash)
				require.False(t, owners != 0 && blk.TokensHash >= 20, "block with tokens %d committed as a root", blk.TokensHash)
			}
		})
	}
}

func TestPool_ParentChainsCanonicalHashes(t *testing.T) {
	p := newTestPool(t, 1000, 1, DefaultMaxKicks)
	p.ApplyEvent(rootEv(mA, b(1, 10)))
	out := p.ApplyEvent(childEv(mA, 1, b(2, 11), b(3, 12)))
	require.NoError(t, out.FirstError, "child store error")
	// The canonical chain equals one root event of all three locals, whatever
	// the external hashes: a router computing from tokens probes these.
	for i, h := range chain(10, 11, 12) {
		owners, res := p.Owners(h)
		assert.False(t, owners != 1 || !res, "canonical %d: Owners = %d, %v; want 1, true", i, owners, res)
	}
	// A root with an explicit start_position 0 is fine.
	ev := rootEv(mB, b(9, 10))
	ev.HasStartPosition = true
	{
		out := p.ApplyEvent(ev)
		require.NoError(t, out.FirstError, "root with start_position 0 error")
	}
	// A repeated store of an owned block is idempotent.
	before := viewOf(p)
	out = p.ApplyEvent(childEv(mA, 1, b(2, 11)))
	require.NoError(t, out.FirstError, "repeated store outcome = %+v, want nothing", out)
	require.Nil(t, out.Batch, "repeated store outcome = %+v, want nothing", out)
	after := viewOf(p)
	require.True(t, after.equal(before), "repeated store changed state")
}

// TestPool_CapacityFailureKeepsSiblings: with room for 8 fingerprints, a
// 10-block event keeps the 8 that fit, records all 10 exactly, and reports
// CapacityExhausted for the first omitted block.
func TestPool_CapacityFailureKeepsSiblings(t *testing.T) {
	p := newTestPool(t, 1, 1, 16) // 2 buckets × 4 slots
	locals := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	blocks := make([]StoredBlock, len(locals))
	for i, l := range locals {
		blocks[i] = b(100+l, l)
	}
	canon := chain(locals...)
	out := p.ApplyEvent(rootEv(mA, blocks...))
	var ee *EventError
	require.ErrorAs(t, out.FirstError, &ee, "FirstError = %v, want CapacityExhausted for canonical %#x", out.FirstError, canon[8])
	require.ErrorIs(t, out.FirstError, ErrCapacityExhausted, "FirstError = %v, want CapacityExhausted for canonical %#x", out.FirstError, canon[8])
	require.Equal(t, canon[8], ee.BlockHash, "FirstError = %v, want CapacityExhausted for canonical %#x", out.FirstError, canon[8])
	d, _ := DispositionOf(FailurePointOf(out.FirstError))
	require.Equal(t, ContinueCapacityOmission, d.Action, "disposition = %+v, want ContinueCapacityOmission", d)
	checkBatch(t, out.Batch, 2)
	for i, h := range canon {
		owners, res := p.Owners(h)
		assert.False(t, owners != 1 || res != (i < 8), "block %d: Owners = %d, %v; want 1, %v", i, owners, res, i < 8)
	}
	s := p.Stats()
	require.False(t, s.CapacityFailures != 2 || s.ResidentBlocks != 8 || s.OccupiedSlots != 8 || s.UniqueBlocks != 10 || s.Contributions != 10, "stats = %+v, want 2 failures, 8 resident = 8 slots, 10 unique, 10 contributions", s)
	got := p.MemberCounts()
	require.True(t, slices.Equal(got, []MemberCount{{mA, 10}}), "MemberCounts = %+v, want 10 blocks for mA", got)

	// A repeated store of a non-resident block on a full table re-offers it
	// without relocation: no RNG draw, no write, one more capacity failure.
	rng := p.t.rng.State()
	words := p.Words()
	out = p.ApplyEvent(rootEv(mB, b(7, canon[9]))) // mB names canonical[9] as a root by its hash
	_ = out
	// mB's root of tokens canon[9] has canonical canon[9]: same block.
	owners, res := p.Owners(canon[9])
	require.Equal(t, uint32(2), owners, "after re-store on full table Owners = %d, %v; want 2, false", owners, res)
	require.False(t, res, "after re-store on full table Owners = %d, %v; want 2, false", owners, res)
	require.ErrorIs(t, out.FirstError, ErrCapacityExhausted, "re-offer on full table error = %v, want ErrCapacityExhausted", out.FirstError)
	require.Equal(t, rng, p.t.rng.State(), "re-offer drew from the RNG or wrote a bucket; it must only use an empty slot")
	require.True(t, slices.Equal(p.Words(), words), "re-offer drew from the RNG or wrote a bucket; it must only use an empty slot")
	require.Equal(t, uint64(3), p.Stats().CapacityFailures, "CapacityFailures = %d, want 3", p.Stats().CapacityFailures)

	// Free a slot: the last owner's removal of a resident block.
	p.ApplyEvent(removedEv(mA, 101))
	out = p.ApplyEvent(rootEv(mA, blocks...)) // replay: blocks 1.. owned, 9 and 10 re-offered
	require.ErrorIs(t, out.FirstError, ErrCapacityExhausted, "replay error = %v, want ErrCapacityExhausted for the block that still does not fit", out.FirstError)
	_, res = p.Owners(canon[0])
	require.True(t, res, "re-stored block 0 is not resident again")
	residentTail := 0
	for _, h := range canon[8:] {
		if _, res := p.Owners(h); res {
			residentTail++
		}
	}
	// Block 0 took the freed slot back (it is first in the event), so the
	// omitted blocks still have no room.
	require.Equal(t, 0, residentTail, "resident tail %d, slots %d, resident %d; want 0, 8, 8", residentTail, p.Stats().OccupiedSlots, p.Stats().ResidentBlocks)
	require.Equal(t, 8, p.Stats().OccupiedSlots, "resident tail %d, slots %d, resident %d; want 0, 8, 8", residentTail, p.Stats().OccupiedSlots, p.Stats().ResidentBlocks)
	require.Equal(t, uint64(8), p.Stats().ResidentBlocks, "resident tail %d, slots %d, resident %d; want 0, 8, 8", residentTail, p.Stats().OccupiedSlots, p.Stats().ResidentBlocks)
	// Free two slots; a re-store of the omitted block by its owner makes it resident.
	p.ApplyEvent(removedEv(mA, 102, 103))
	out = p.ApplyEvent(childEv(mA, 108, b(109, 9)))
	require.NoError(t, out.FirstError, "re-offer with room error")
	owners, res = p.Owners(canon[8])
	require.Equal(t, uint32(1), owners, "re-offered block Owners = %d, %v; want 1, true and found", owners, res)
	require.True(t, res, "re-offered block Owners = %d, %v; want 1, true and found", owners, res)
	require.True(t, p.Contains(canon[8]), "re-offered block Owners = %d, %v; want 1, true and found", owners, res)
}

func TestPool_StoreThenRemoveInOneWindowPublishesNothing(t *testing.T) {
	p := newTestPool(t, 1000, 2, DefaultMaxKicks)
	out := p.ApplyEvent(rootEv(mA, b(1, 10), b(2, 11)))
	require.False(t, out.PublicationBoundary, "first event outcome = %+v, pending %v/%d; want no boundary yet", out, p.HasPendingPublication(), p.PendingEventCount())
	require.Nil(t, out.Batch, "first event outcome = %+v, pending %v/%d; want no boundary yet", out, p.HasPendingPublication(), p.PendingEventCount())
	require.True(t, p.HasPendingPublication(), "first event outcome = %+v, pending %v/%d; want no boundary yet", out, p.HasPendingPublication(), p.PendingEventCount())
	require.Equal(t, uint64(1), p.PendingEventCount(), "first event outcome = %+v, pending %v/%d; want no boundary yet", out, p.HasPendingPublication(), p.PendingEventCount())
	out = p.ApplyEvent(removedEv(mA, 1, 2))
	require.True(t, out.PublicationBoundary, "second event outcome = %+v, want a boundary with no batch (net reversion)", out)
	require.Nil(t, out.Batch, "second event outcome = %+v, want a boundary with no batch (net reversion)", out)
	s := p.Stats()
	require.NotEqual(t, uint64(0), s.NetRevertedBuckets, "stats = %+v, want net reversions, 0 emitted images, 4 touches, 0 pending", s)
	require.Equal(t, uint64(0), s.EmittedImages, "stats = %+v, want net reversions, 0 emitted images, 4 touches, 0 pending", s)
	require.Equal(t, uint64(4), s.PhysicalTouches, "stats = %+v, want net reversions, 0 emitted images, 4 touches, 0 pending", s)
	require.Equal(t, uint64(0), s.PendingEvents, "stats = %+v, want net reversions, 0 emitted images, 4 touches, 0 pending", s)
	require.False(t, p.HasPendingPublication(), "window not cleared after the boundary")
}

// TestPool_CadenceBoundaries: with PublishEveryNEvents = 3 a batch covers
// exactly the admitted events of its window and the boundary falls on every
// third admitted event; ignored events do not count; errors do.
func TestPool_CadenceBoundaries(t *testing.T) {
	p := newTestPool(t, 1000, 3, DefaultMaxKicks)
	consumer := make([]uint64, p.Format().BucketCount)
	held := p.Words()
	steps := []struct {
		ev       *RouterEvent
		boundary bool
		pending  uint64
	}{
		{rootEv(mA, b(1, 10)), false, 1},
		{onTier(rootEv(mA, b(2, 20)), TierDisk), false, 1}, // ignored
		{childEv(mA, 999, b(3, 30)), false, 2},             // parent not found: admitted, counted
		{rootEv(mB, b(4, 40)), true, 0},
		{removedEv(mA, 1), false, 1},
		{rootEv(mA, b(5, 50)), false, 2},
		{removedEv(mB, 12345), true, 0}, // unknown removal still counts
	}
	for i, s := range steps {
		out := p.ApplyEvent(s.ev)
		require.Equal(t, s.boundary, out.PublicationBoundary, "step %d: boundary %v pending %d, want %v %d", i, out.PublicationBoundary, p.PendingEventCount(), s.boundary, s.pending)
		require.Equal(t, s.pending, p.PendingEventCount(), "step %d: boundary %v pending %d, want %v %d", i, out.PublicationBoundary, p.PendingEventCount(), s.boundary, s.pending)
		require.False(t, !s.boundary && out.Batch != nil, "step %d published between boundaries", i)
		require.False(t, !s.boundary && !slices.Equal(consumer, held), "step %d: consumer moved without a batch", i)
		checkBatch(t, out.Batch, p.Format().BucketCount)
		applyBatch(consumer, out.Batch)
		if s.boundary {
			require.True(t, slices.Equal(consumer, p.Words()), "step %d: consumer after boundary differs from producer", i)
			held = p.Words()
		}
	}
}

func TestPool_Flush(t *testing.T) {
	p := newTestPool(t, 1000, 100, DefaultMaxKicks)
	require.Nil(t, p.Flush(), "Flush of an empty window returned a batch")
	p.ApplyEvent(rootEv(mA, b(1, 10)))
	p.ApplyEvent(rootEv(mB, b(2, 20)))
	batch := p.Flush()
	checkBatch(t, batch, p.Format().BucketCount)
	require.NotNil(t, batch, "Flush = %+v, pending %d; want a batch and an empty window", batch, p.PendingEventCount())
	require.Equal(t, uint64(0), p.PendingEventCount(), "Flush = %+v, pending %d; want a batch and an empty window", batch, p.PendingEventCount())
	require.False(t, p.HasPendingPublication(), "Flush = %+v, pending %d; want a batch and an empty window", batch, p.PendingEventCount())
	consumer := make([]uint64, p.Format().BucketCount)
	applyBatch(consumer, batch)
	require.True(t, slices.Equal(consumer, p.Words()), "flushed batch does not reconstruct the words")
	require.Nil(t, p.Flush(), "second Flush returned a batch")
	// A flush of a net-reverted window drains it and returns nil.
	p.ApplyEvent(rootEv(mA, b(3, 30)))
	p.ApplyEvent(removedEv(mA, 3))
	{
		batch := p.Flush()
		require.Nil(t, batch, "Flush of a net reversion = %+v, pending %d/%v; want nil and drained", batch, p.PendingEventCount(), p.HasPendingPublication())
		require.Equal(t, uint64(0), p.PendingEventCount(), "Flush of a net reversion = %+v, pending %d/%v; want nil and drained", batch, p.PendingEventCount(), p.HasPendingPublication())
		require.False(t, p.HasPendingPublication(), "Flush of a net reversion = %+v, pending %d/%v; want nil and drained", batch, p.PendingEventCount(), p.HasPendingPublication())
	}
}

func TestPool_BarrierSnapshot(t *testing.T) {
	p := newTestPool(t, 1000, 100, DefaultMaxKicks)
	p.ApplyEvent(rootEv(mA, b(1, 10)))
	p.Flush()
	consumer := p.Words() // an old subscriber holding everything published so far
	p.ApplyEvent(rootEv(mB, b(2, 20)))
	p.ApplyEvent(removedEv(mA, 1))
	tail, words := p.BarrierSnapshot()
	checkBatch(t, tail, p.Format().BucketCount)
	require.NotNil(t, tail, "BarrierSnapshot tail = nil, want the pending window")
	require.True(t, slices.Equal(words, p.Words()), "snapshot copy differs from the state after the tail")
	applyBatch(consumer, tail)
	require.True(t, slices.Equal(consumer, words), "old stream plus tail differs from the snapshot copy")
	require.False(t, p.HasPendingPublication(), "BarrierSnapshot did not drain the window")
	require.Equal(t, uint64(0), p.PendingEventCount(), "BarrierSnapshot did not drain the window")
	clear(words)
	require.True(t, p.Contains(chain(20)[0]), "mutating the snapshot copy changed the pool")
	tail2, w2 := p.BarrierSnapshot()
	require.Nil(t, tail2, "second BarrierSnapshot tail = %+v, want nil and the same words", tail2)
	require.True(t, slices.Equal(w2, p.Words()), "second BarrierSnapshot tail = %+v, want nil and the same words", tail2)
}

func TestPool_RemoveRank(t *testing.T) {
	p := newTestPool(t, 1000, 100, DefaultMaxKicks)
	p.ApplyEvent(rootEv(mA, b(1, 10), b(2, 11)))
	p.ApplyEvent(rootEv(mB, b(1, 10)))
	p.Flush()
	consumer := p.Words()
	p.ApplyEvent(rootEv(mB, b(3, 30))) // pending, not published
	batch, err := p.RemoveRank(mA)
	require.NoError(t, err, "RemoveRank error")
	checkBatch(t, batch, p.Format().BucketCount)
	applyBatch(consumer, batch)
	require.True(t, slices.Equal(consumer, p.Words()), "RemoveRank batch (unconditional drain) does not bring the consumer to the words")
	got := p.MemberCounts()
	require.True(t, slices.Equal(got, []MemberCount{{mB, 2}}), "MemberCounts = %+v, want only mB with 2", got)
	owners, res := p.Owners(chain(10)[0])
	require.Equal(t, uint32(1), owners, "shared root Owners = %d, %v; want 1, true", owners, res)
	require.True(t, res, "shared root Owners = %d, %v; want 1, true", owners, res)
	require.False(t, p.Contains(chain(10, 11)[1]), "mA's exclusive block still present")
	{
		batch, err := p.RemoveRank(Member{WorkerID: 99})
		require.Nil(t, batch, "RemoveRank(unknown) = %+v, %v; want nil, nil", batch, err)
		require.NoError(t, err, "RemoveRank(unknown) = %+v, %v; want nil, nil", batch, err)
	}
}

// TestPool_RepresentationCollision: two canonical hashes with identical
// (fp, a, b) each take a slot; the fingerprint stays until both owners leave.
func TestPool_RepresentationCollision(t *testing.T) {
	p := newTestPool(t, 1, 1, 16) // 2 buckets: a collision needs ~2^8.5 keys
	seen := map[Address]uint64{}
	var k1, k2 uint64
	for k := uint64(1); ; k++ {
		ad := p.t.addr.Address(k)
		if prev, ok := seen[ad]; ok {
			k1, k2 = prev, k
			break
		}
		seen[ad] = k
	}
	require.Equal(t, p.t.addr.Address(k2), p.t.addr.Address(k1), "search found %d and %d with different addresses", k1, k2)
	// Roots: canonical = tokens hash.
	p.ApplyEvent(rootEv(mA, b(1, k1)))
	p.ApplyEvent(rootEv(mB, b(2, k2)))
	s := p.Stats()
	require.Equal(t, 2, s.OccupiedSlots, "two colliding blocks occupy %d slots (%d resident), want 2", s.OccupiedSlots, s.ResidentBlocks)
	require.Equal(t, uint64(2), s.ResidentBlocks, "two colliding blocks occupy %d slots (%d resident), want 2", s.OccupiedSlots, s.ResidentBlocks)
	p.ApplyEvent(removedEv(mA, 1))
	require.True(t, p.Contains(k2), "after removing one owner Contains(k2) = %v, slots = %d; want true, 1", p.Contains(k2), p.Stats().OccupiedSlots)
	require.Equal(t, 1, p.Stats().OccupiedSlots, "after removing one owner Contains(k2) = %v, slots = %d; want true, 1", p.Contains(k2), p.Stats().OccupiedSlots)
	owners, res := p.Owners(k2)
	require.Equal(t, uint32(1), owners, "k2 Owners = %d, %v; want 1, true", owners, res)
	require.True(t, res, "k2 Owners = %d, %v; want 1, true", owners, res)
	// Removing k1 again is an unknown removal: the state never deletes by fingerprint alone.
	out := p.ApplyEvent(removedEv(mA, 1))
	require.Equal(t, 1, out.UnknownRemovals, "repeated removal: unknown %d, Contains(k2) %v; want 1, true", out.UnknownRemovals, p.Contains(k2))
	require.True(t, p.Contains(k2), "repeated removal: unknown %d, Contains(k2) %v; want 1, true", out.UnknownRemovals, p.Contains(k2))
	p.ApplyEvent(removedEv(mB, 2))
	require.False(t, p.Contains(k1), "fingerprint present after both owners left")
	require.False(t, p.Contains(k2), "fingerprint present after both owners left")
	require.Equal(t, 0, p.Stats().OccupiedSlots, "fingerprint present after both owners left")
}

// TestPool_BoundedRelocationRollsBack: a failed insertion leaves the words
// byte-identical, marks nothing dirty and publishes nothing.
func TestPool_BoundedRelocationRollsBack(t *testing.T) {
	p := newTestPool(t, 1, 1, 50)
	for i := uint64(0); i < 8; i++ {
		p.ApplyEvent(rootEv(mA, b(i, 1000+i)))
	}
	before := p.Stats()
	words := p.Words()
	out := p.ApplyEvent(rootEv(mB, b(1, 77)))
	require.ErrorIs(t, out.FirstError, ErrCapacityExhausted, "FirstError = %v, want ErrCapacityExhausted", out.FirstError)
	require.Nil(t, out.Batch, "failed relocation published %+v / left a window; want nothing dirty", out.Batch)
	require.False(t, p.HasPendingPublication(), "failed relocation published %+v / left a window; want nothing dirty", out.Batch)
	require.True(t, slices.Equal(p.Words(), words), "words changed after a failed relocation")
	after := p.Stats()
	require.Equal(t, before.PhysicalTouches, after.PhysicalTouches, "touch counters moved: before %+v after %+v", before, after)
	require.Equal(t, before.DistinctTouchedBuckets, after.DistinctTouchedBuckets, "touch counters moved: before %+v after %+v", before, after)
	owners, res := p.Owners(77)
	require.Equal(t, uint32(1), owners, "omitted block Owners = %d, %v; want 1, false", owners, res)
	require.False(t, res, "omitted block Owners = %d, %v; want 1, false", owners, res)
}

func TestPool_StatsAndMemberCounts(t *testing.T) {
	p := newTestPool(t, 1000, 2, DefaultMaxKicks)
	members := []Member{{3, 1}, {1, 2}, {3, 0}, {1, 0}, {2, 5}}
	for i, m := range members {
		p.ApplyEvent(rootEv(m, b(1, 10), b(uint64(2+i), uint64(20+i))))
	}
	p.ApplyEvent(removedEv(Member{1, 0}, 404))
	p.ApplyEvent(childEv(Member{1, 0}, 404, b(5, 5)))
	want := []MemberCount{{Member{1, 0}, 2}, {Member{1, 2}, 2}, {Member{2, 5}, 2}, {Member{3, 0}, 2}, {Member{3, 1}, 2}}
	{
		got := p.MemberCounts()
		require.True(t, slices.Equal(got, want), "MemberCounts = %+v, want %+v", got, want)
	}
	s := p.Stats()
	nb := p.Format().BucketCount
	checks := []struct {
		name      string
		got, want uint64
	}{
		{"Members", uint64(s.Members), 5},
		{"Contributions", s.Contributions, 10},
		{"UniqueBlocks", uint64(s.UniqueBlocks), 6},
		{"ResidentBlocks", s.ResidentBlocks, 6},
		{"UnknownRemovals", s.UnknownRemovals, 1},
		{"ParentNotFound", s.ParentNotFound, 1},
		{"CapacityFailures", s.CapacityFailures, 0},
		{"OccupiedSlots", uint64(s.OccupiedSlots), 6},
		{"PendingEvents", s.PendingEvents, 1},
		{"PhysicalTouches", s.PhysicalTouches, 6},
		{"FilterBytes", s.FilterBytes, nb * 8},
	}
	for _, c := range checks {
		assert.Equal(t, c.want, c.got, "Stats.%s = %d, want %d", c.name, c.got, c.want)
	}
	assert.False(t, s.OccupiedBuckets < 1 || s.OccupiedBuckets > 6, "OccupiedBuckets = %d, want 1..6", s.OccupiedBuckets)
	assert.False(t, s.DistinctTouchedBuckets < uint64(s.OccupiedBuckets) || s.EmittedImages < uint64(s.OccupiedBuckets), "DistinctTouched %d, Emitted %d; want ≥ occupied buckets %d", s.DistinctTouchedBuckets, s.EmittedImages, s.OccupiedBuckets)
	assert.False(t, s.DirtyTrackingBytes < nb*4 || s.ExactStateBytes == 0, "DirtyTrackingBytes %d (want ≥ %d), ExactStateBytes %d (want > 0)", s.DirtyTrackingBytes, nb*4, s.ExactStateBytes)
}

func TestNewPool_FormatAndConfig(t *testing.T) {
	c := DefaultConfig()
	c.ExpectedBlocks = 32
	c.Seed = 5
	p, err := NewPool(c)
	require.NoError(t, err)
	require.Equal(t, c, p.Config(), "Config %+v Format %+v words %d; want the config, 16 buckets seed 5", p.Config(), p.Format(), len(p.Words()))
	require.Equal(t, NewFormat(5, 16), p.Format(), "Config %+v Format %+v words %d; want the config, 16 buckets seed 5", p.Config(), p.Format(), len(p.Words()))
	require.Len(t, p.Words(), 16, "Config %+v Format %+v words %d; want the config, 16 buckets seed 5", p.Config(), p.Format(), len(p.Words()))
}

// TestPool_IndexerInvariantViolation: when the filter has lost a resident
// fingerprint (simulated corruption), the last owner's removal reports
// IndexerInvariantViolation, which fences and rebuilds the producer.
func TestPool_IndexerInvariantViolation(t *testing.T) {
	p := newTestPool(t, 1000, 1, DefaultMaxKicks)
	p.ApplyEvent(rootEv(mA, b(1, 10)))
	clear(p.t.words) // corrupt: the filter no longer holds the block
	out := p.ApplyEvent(removedEv(mA, 1))
	var ee *EventError
	require.ErrorAs(t, out.FirstError, &ee, "FirstError = %v, want IndexerInvariantViolation for the canonical hash", out.FirstError)
	require.ErrorIs(t, out.FirstError, ErrIndexerInvariantViolation, "FirstError = %v, want IndexerInvariantViolation for the canonical hash", out.FirstError)
	require.Equal(t, chain(10)[0], ee.BlockHash, "FirstError = %v, want IndexerInvariantViolation for the canonical hash", out.FirstError)
	d, _ := DispositionOf(FailurePointOf(out.FirstError))
	require.Equal(t, FenceAndRebuildProducer, d.Action, "disposition = %+v, want FenceAndRebuildProducer", d)
	require.Nil(t, out.Batch, "invariant violation published %+v", out.Batch)
}

// TestPool_OwnershipDegreeOverflow: a block at the maximum owner count is
// skipped for the new owner (no lineage, no ownership) and reported.
func TestPool_OwnershipDegreeOverflow(t *testing.T) {
	p := newTestPool(t, 1000, 1, DefaultMaxKicks)
	p.ApplyEvent(rootEv(mA, b(1, 10)))
	c := chain(10)[0]
	p.blocks[p.blockShard(c)].put(c, 1<<32-1)
	out := p.ApplyEvent(rootEv(mB, b(2, 10), b(3, 11)))
	require.ErrorIs(t, out.FirstError, ErrOwnershipDegreeOverflow, "FirstError = %v, want ErrOwnershipDegreeOverflow", out.FirstError)
	require.Equal(t, SourceProtocolFailure, FailurePointOf(out.FirstError), "failure point = %v, want SourceProtocolFailure", FailurePointOf(out.FirstError))
	{
		owners, _ := p.Owners(c)
		require.Equal(t, uint32(1<<32-1), owners, "owners = %d, want unchanged max", owners)
	}
	got := p.MemberCounts()
	require.True(t, slices.Equal(got, []MemberCount{{mA, 1}, {mB, 1}}), "MemberCounts = %+v, want mB holding only its second block", got)
}

// TestPool_SnapshotPlusBatchesReconstructWords: a consumer that joins at a
// barrier snapshot taken mid-history and installs every later batch (events,
// flush, rank reset, replacement) holds the producer's bytes at every drain.
func TestPool_SnapshotPlusBatchesReconstructWords(t *testing.T) {
	p := newTestPool(t, 16, 3, 20)
	for i := uint64(0); i < 6; i++ {
		p.ApplyEvent(rootEv(mA, b(i, 100+i)))
	}
	tail, consumer := p.BarrierSnapshot() // the tail goes to older subscribers only
	_ = tail
	ops := []func() *Batch{
		func() *Batch { return p.ApplyEvent(rootEv(mB, b(1, 100), b(2, 200))).Batch },
		func() *Batch { return p.ApplyEvent(removedEv(mA, 0, 1)).Batch },
		func() *Batch { return p.ApplyEvent(childEv(mB, 2, b(3, 300), b(4, 301))).Batch },
		func() *Batch { return p.Flush() },
		func() *Batch { return p.ApplyEvent(rootEv(mC, b(9, 900))).Batch },
		func() *Batch { b, _ := p.RemoveRank(mA); return b },
		func() *Batch { return p.ApplyEvent(rootEv(mA, b(5, 105))).Batch },
		func() *Batch {
			b, err := p.ReplaceRanks([]RankReplacement{{mB, events(rootEv(mB, b(1, 100)))}})
			require.NoError(t, err, "ReplaceRanks error")
			return b
		},
		func() *Batch { return p.ApplyEvent(clearedEv(mC)).Batch },
		func() *Batch { return p.Flush() },
	}
	for i, op := range ops {
		batch := op()
		checkBatch(t, batch, p.Format().BucketCount)
		applyBatch(consumer, batch)
		require.False(t, !p.HasPendingPublication() && !slices.Equal(consumer, p.Words()), "op %d: snapshot + batches %#x, producer %#x", i, consumer, p.Words())
	}
	require.True(t, slices.Equal(consumer, p.Words()), "after the final flush the consumer differs from the producer")
}
