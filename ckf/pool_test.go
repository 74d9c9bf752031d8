package ckf

import (
	"errors"
	"slices"
	"testing"
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
	if out.FirstError != nil || !out.PublicationBoundary || out.Batch == nil {
		t.Fatalf("store outcome = %+v, want no error, a boundary and a batch", out)
	}
	checkBatch(t, out.Batch, p.Format().BucketCount)
	applyBatch(consumer, out.Batch)
	for i, h := range c {
		if owners, res := p.Owners(h); owners != 1 || !res {
			t.Errorf("Owners(block %d) = %d, %v; want 1, true", i, owners, res)
		}
		if !p.Contains(h) {
			t.Errorf("Contains(block %d) = false, want true", i)
		}
	}
	if !slices.Equal(consumer, p.Words()) {
		t.Fatal("consumer after store batch differs from producer words")
	}
	out = p.ApplyEvent(removedEv(mA, 100, 101, 102))
	if out.FirstError != nil || out.Batch == nil || out.UnknownRemovals != 0 {
		t.Fatalf("remove outcome = %+v, want a batch and no error", out)
	}
	for _, im := range out.Batch.Images {
		if im.Word != 0 {
			t.Errorf("final removal image for bucket %d = %#x, want explicit zero", im.Bucket, im.Word)
		}
	}
	applyBatch(consumer, out.Batch)
	if !slices.Equal(consumer, p.Words()) || slices.ContainsFunc(consumer, func(w uint64) bool { return w != 0 }) {
		t.Fatal("consumer after remove batch is not the all-zero producer table")
	}
	if s := p.Stats(); s.Members != 0 || s.UniqueBlocks != 0 || s.Contributions != 0 || s.ResidentBlocks != 0 {
		t.Fatalf("stats after removing everything = %+v, want empty aggregation", s)
	}
}

func TestPool_SharedOwnershipSurvivesNonFinalRemoval(t *testing.T) {
	p := newTestPool(t, 1000, 1, DefaultMaxKicks)
	k := chain(5)[0]
	p.ApplyEvent(rootEv(mA, b(1, 5)))
	out := p.ApplyEvent(rootEv(mB, b(2, 5))) // same tokens, another member
	if out.Batch != nil {
		t.Fatalf("second owner published %+v, want nothing (only the 0→1 owner inserts)", out.Batch)
	}
	if owners, _ := p.Owners(k); owners != 2 {
		t.Fatalf("owners = %d, want 2", owners)
	}
	if s := p.Stats(); s.OccupiedSlots != 1 || s.Contributions != 2 || s.UniqueBlocks != 1 {
		t.Fatalf("stats = %+v, want 1 slot, 2 contributions, 1 unique block", s)
	}
	out = p.ApplyEvent(removedEv(mA, 1))
	if out.Batch != nil || out.FirstError != nil {
		t.Fatalf("non-final removal outcome = %+v, want no batch, no error", out)
	}
	if owners, res := p.Owners(k); owners != 1 || !res || !p.Contains(k) {
		t.Fatalf("after non-final removal Owners = %d, %v, Contains = %v; want 1, true, true", owners, res, p.Contains(k))
	}
	out = p.ApplyEvent(removedEv(mB, 2))
	if out.Batch == nil || p.Contains(k) {
		t.Fatalf("final removal: batch %+v, Contains %v; want a zero image and absent", out.Batch, p.Contains(k))
	}
}

func TestPool_ClearKeepsSiblingRanks(t *testing.T) {
	p := newTestPool(t, 1000, 1, DefaultMaxKicks)
	p.ApplyEvent(rootEv(mA, b(1, 10), b(2, 11)))
	p.ApplyEvent(rootEv(mC, b(1, 20))) // same worker, rank 1, same external hash 1
	p.ApplyEvent(rootEv(mC, b(3, 10))) // shares canonical 10 with mA
	out := p.ApplyEvent(clearedEv(mA))
	if out.FirstError != nil {
		t.Fatalf("clear error = %v", out.FirstError)
	}
	if got, want := p.MemberCounts(), []MemberCount{{mC, 2}}; !slices.Equal(got, want) {
		t.Fatalf("MemberCounts after clearing rank 0 = %+v, want %+v", got, want)
	}
	c10, c11, c20 := chain(10)[0], chain(10, 11)[1], chain(20)[0]
	for _, tc := range []struct {
		name   string
		h      uint64
		owners uint32
	}{{"shared root", c10, 1}, {"rank 0 only", c11, 0}, {"rank 1 only", c20, 1}} {
		if owners, _ := p.Owners(tc.h); owners != tc.owners {
			t.Errorf("%s: owners = %d, want %d", tc.name, owners, tc.owners)
		}
	}
	if p.Contains(c11) && p.Stats().OccupiedSlots != 2 {
		t.Errorf("occupied slots = %d, want 2", p.Stats().OccupiedSlots)
	}
	// Rank 1 can still remove by its own external hash 1.
	if out := p.ApplyEvent(removedEv(mC, 1)); out.UnknownRemovals != 0 {
		t.Fatalf("sibling removal counted %d unknown, want 0", out.UnknownRemovals)
	}
}

func TestPool_TierFiltering(t *testing.T) {
	p := newTestPool(t, 1000, 2, DefaultMaxKicks)
	for _, tier := range []StorageTier{TierHostPinned, TierDisk, TierExternal} {
		out := p.ApplyEvent(onTier(rootEv(mA, b(1, 10)), tier))
		if out != (ApplyOutcome{}) {
			t.Fatalf("%v store outcome = %+v, want zero (ignored)", tier, out)
		}
		out = p.ApplyEvent(onTier(removedEv(mA, 99), tier))
		if out != (ApplyOutcome{}) {
			t.Fatalf("%v unknown removal outcome = %+v, want zero (ignored, not counted)", tier, out)
		}
	}
	if p.PendingEventCount() != 0 || p.Stats().Members != 0 || p.Stats().UnknownRemovals != 0 {
		t.Fatalf("non-device events changed state: pending %d, stats %+v", p.PendingEventCount(), p.Stats())
	}
	out := p.ApplyEvent(removedEv(mA, 99, 98))
	if out.UnknownRemovals != 2 || out.FirstError != nil || p.Stats().UnknownRemovals != 2 || p.PendingEventCount() != 1 {
		t.Fatalf("device unknown removal: outcome %+v, stats unknown %d, pending %d; want 2 counted, 1 pending",
			out, p.Stats().UnknownRemovals, p.PendingEventCount())
	}
	// Cleared from a non-device tier still clears the member's device state.
	p.ApplyEvent(rootEv(mA, b(1, 10)))
	if p.Stats().Members != 1 {
		t.Fatal("device store did not apply")
	}
	if !p.HasPendingPublication() && p.PendingEventCount() != 0 {
		t.Fatalf("pending = %d after the boundary, want 0", p.PendingEventCount())
	}
	p.ApplyEvent(onTier(clearedEv(mA), TierDisk))
	if p.Stats().Members != 0 || p.Contains(chain(10)[0]) {
		t.Fatalf("disk-tier clear left members=%d, contains=%v; want cleared", p.Stats().Members, p.Contains(chain(10)[0]))
	}
	if p.PendingEventCount() != 1 {
		t.Fatalf("PendingEventCount after a disk-tier clear = %d, want 1 (it is admitted)", p.PendingEventCount())
	}
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
			if !errors.Is(out.FirstError, tc.want) {
				t.Fatalf("FirstError = %v, want %v", out.FirstError, tc.want)
			}
			if out.Batch != nil || out.PublicationBoundary {
				t.Fatalf("outcome = %+v, want no batch and no boundary", out)
			}
			if after := viewOf(p); !after.equal(before) {
				t.Fatalf("state changed: before %+v, after %+v", before, after)
			}
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
			if !errors.Is(out.FirstError, tc.want) {
				t.Fatalf("FirstError = %v, want %v", out.FirstError, tc.want)
			}
			var ee *EventError
			if !errors.As(out.FirstError, &ee) || ee.BlockHash != tc.block || ee.Member != tc.ev.Member() {
				t.Fatalf("EventError = %+v, want block %#x of member %+v", ee, tc.block, tc.ev.Member())
			}
			if out.Batch != nil {
				t.Fatalf("rejected event published %+v", out.Batch)
			}
			after := viewOf(p)
			wantStats := before.stats
			if tc.want == ErrParentBlockNotFound {
				wantStats.ParentNotFound++
			}
			if !slices.Equal(after.words, before.words) || !slices.Equal(after.counts, before.counts) || after.stats != wantStats {
				t.Fatalf("rejected event changed state:\n before %+v\n after  %+v", before, after)
			}
			for _, blk := range tc.ev.Blocks {
				if owners, _ := p.Owners(blk.TokensHash); owners != 0 && blk.TokensHash >= 20 {
					t.Fatalf("block with tokens %d committed as a root", blk.TokensHash)
				}
			}
		})
	}
}

func TestPool_ParentChainsCanonicalHashes(t *testing.T) {
	p := newTestPool(t, 1000, 1, DefaultMaxKicks)
	p.ApplyEvent(rootEv(mA, b(1, 10)))
	out := p.ApplyEvent(childEv(mA, 1, b(2, 11), b(3, 12)))
	if out.FirstError != nil {
		t.Fatalf("child store error = %v", out.FirstError)
	}
	// The canonical chain equals one root event of all three locals, whatever
	// the external hashes: a router computing from tokens probes these.
	for i, h := range chain(10, 11, 12) {
		if owners, res := p.Owners(h); owners != 1 || !res {
			t.Errorf("canonical %d: Owners = %d, %v; want 1, true", i, owners, res)
		}
	}
	// A root with an explicit start_position 0 is fine.
	ev := rootEv(mB, b(9, 10))
	ev.HasStartPosition = true
	if out := p.ApplyEvent(ev); out.FirstError != nil {
		t.Fatalf("root with start_position 0 error = %v", out.FirstError)
	}
	// A repeated store of an owned block is idempotent.
	before := viewOf(p)
	out = p.ApplyEvent(childEv(mA, 1, b(2, 11)))
	if out.FirstError != nil || out.Batch != nil {
		t.Fatalf("repeated store outcome = %+v, want nothing", out)
	}
	if after := viewOf(p); !after.equal(before) {
		t.Fatalf("repeated store changed state")
	}
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
	if !errors.As(out.FirstError, &ee) || !errors.Is(out.FirstError, ErrCapacityExhausted) || ee.BlockHash != canon[8] {
		t.Fatalf("FirstError = %v, want CapacityExhausted for canonical %#x", out.FirstError, canon[8])
	}
	if d, _ := DispositionOf(FailurePointOf(out.FirstError)); d.Action != ContinueCapacityOmission {
		t.Fatalf("disposition = %+v, want ContinueCapacityOmission", d)
	}
	checkBatch(t, out.Batch, 2)
	for i, h := range canon {
		owners, res := p.Owners(h)
		if owners != 1 || res != (i < 8) {
			t.Errorf("block %d: Owners = %d, %v; want 1, %v", i, owners, res, i < 8)
		}
	}
	s := p.Stats()
	if s.CapacityFailures != 2 || s.ResidentBlocks != 8 || s.OccupiedSlots != 8 || s.UniqueBlocks != 10 || s.Contributions != 10 {
		t.Fatalf("stats = %+v, want 2 failures, 8 resident = 8 slots, 10 unique, 10 contributions", s)
	}
	if got := p.MemberCounts(); !slices.Equal(got, []MemberCount{{mA, 10}}) {
		t.Fatalf("MemberCounts = %+v, want 10 blocks for mA", got)
	}

	// A repeated store of a non-resident block on a full table re-offers it
	// without relocation: no RNG draw, no write, one more capacity failure.
	rng := p.t.rng.State()
	words := p.Words()
	out = p.ApplyEvent(rootEv(mB, b(7, canon[9]))) // mB names canonical[9] as a root by its hash
	_ = out
	// mB's root of tokens canon[9] has canonical canon[9]: same block.
	if owners, res := p.Owners(canon[9]); owners != 2 || res {
		t.Fatalf("after re-store on full table Owners = %d, %v; want 2, false", owners, res)
	}
	if !errors.Is(out.FirstError, ErrCapacityExhausted) {
		t.Fatalf("re-offer on full table error = %v, want ErrCapacityExhausted", out.FirstError)
	}
	if p.t.rng.State() != rng || !slices.Equal(p.Words(), words) {
		t.Fatal("re-offer drew from the RNG or wrote a bucket; it must only use an empty slot")
	}
	if p.Stats().CapacityFailures != 3 {
		t.Fatalf("CapacityFailures = %d, want 3", p.Stats().CapacityFailures)
	}

	// Free a slot: the last owner's removal of a resident block.
	p.ApplyEvent(removedEv(mA, 101))
	out = p.ApplyEvent(rootEv(mA, blocks...)) // replay: blocks 1.. owned, 9 and 10 re-offered
	if !errors.Is(out.FirstError, ErrCapacityExhausted) {
		t.Fatalf("replay error = %v, want ErrCapacityExhausted for the block that still does not fit", out.FirstError)
	}
	if _, res := p.Owners(canon[0]); !res {
		t.Fatal("re-stored block 0 is not resident again")
	}
	residentTail := 0
	for _, h := range canon[8:] {
		if _, res := p.Owners(h); res {
			residentTail++
		}
	}
	// Block 0 took the freed slot back (it is first in the event), so the
	// omitted blocks still have no room.
	if residentTail != 0 || p.Stats().OccupiedSlots != 8 || p.Stats().ResidentBlocks != 8 {
		t.Fatalf("resident tail %d, slots %d, resident %d; want 0, 8, 8", residentTail, p.Stats().OccupiedSlots, p.Stats().ResidentBlocks)
	}
	// Free two slots; a re-store of the omitted block by its owner makes it resident.
	p.ApplyEvent(removedEv(mA, 102, 103))
	out = p.ApplyEvent(childEv(mA, 108, b(109, 9)))
	if out.FirstError != nil {
		t.Fatalf("re-offer with room error = %v", out.FirstError)
	}
	if owners, res := p.Owners(canon[8]); owners != 1 || !res || !p.Contains(canon[8]) {
		t.Fatalf("re-offered block Owners = %d, %v; want 1, true and found", owners, res)
	}
}

func TestPool_StoreThenRemoveInOneWindowPublishesNothing(t *testing.T) {
	p := newTestPool(t, 1000, 2, DefaultMaxKicks)
	out := p.ApplyEvent(rootEv(mA, b(1, 10), b(2, 11)))
	if out.PublicationBoundary || out.Batch != nil || !p.HasPendingPublication() || p.PendingEventCount() != 1 {
		t.Fatalf("first event outcome = %+v, pending %v/%d; want no boundary yet", out, p.HasPendingPublication(), p.PendingEventCount())
	}
	out = p.ApplyEvent(removedEv(mA, 1, 2))
	if !out.PublicationBoundary || out.Batch != nil {
		t.Fatalf("second event outcome = %+v, want a boundary with no batch (net reversion)", out)
	}
	s := p.Stats()
	if s.NetRevertedBuckets == 0 || s.EmittedImages != 0 || s.PhysicalTouches != 4 || s.PendingEvents != 0 {
		t.Fatalf("stats = %+v, want net reversions, 0 emitted images, 4 touches, 0 pending", s)
	}
	if p.HasPendingPublication() {
		t.Fatal("window not cleared after the boundary")
	}
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
		if out.PublicationBoundary != s.boundary || p.PendingEventCount() != s.pending {
			t.Fatalf("step %d: boundary %v pending %d, want %v %d", i, out.PublicationBoundary, p.PendingEventCount(), s.boundary, s.pending)
		}
		if !s.boundary && out.Batch != nil {
			t.Fatalf("step %d published between boundaries", i)
		}
		if !s.boundary && !slices.Equal(consumer, held) {
			t.Fatalf("step %d: consumer moved without a batch", i)
		}
		checkBatch(t, out.Batch, p.Format().BucketCount)
		applyBatch(consumer, out.Batch)
		if s.boundary {
			if !slices.Equal(consumer, p.Words()) {
				t.Fatalf("step %d: consumer after boundary differs from producer", i)
			}
			held = p.Words()
		}
	}
}

func TestPool_Flush(t *testing.T) {
	p := newTestPool(t, 1000, 100, DefaultMaxKicks)
	if p.Flush() != nil {
		t.Fatal("Flush of an empty window returned a batch")
	}
	p.ApplyEvent(rootEv(mA, b(1, 10)))
	p.ApplyEvent(rootEv(mB, b(2, 20)))
	batch := p.Flush()
	checkBatch(t, batch, p.Format().BucketCount)
	if batch == nil || p.PendingEventCount() != 0 || p.HasPendingPublication() {
		t.Fatalf("Flush = %+v, pending %d; want a batch and an empty window", batch, p.PendingEventCount())
	}
	consumer := make([]uint64, p.Format().BucketCount)
	applyBatch(consumer, batch)
	if !slices.Equal(consumer, p.Words()) {
		t.Fatal("flushed batch does not reconstruct the words")
	}
	if p.Flush() != nil {
		t.Fatal("second Flush returned a batch")
	}
	// A flush of a net-reverted window drains it and returns nil.
	p.ApplyEvent(rootEv(mA, b(3, 30)))
	p.ApplyEvent(removedEv(mA, 3))
	if batch := p.Flush(); batch != nil || p.PendingEventCount() != 0 || p.HasPendingPublication() {
		t.Fatalf("Flush of a net reversion = %+v, pending %d/%v; want nil and drained", batch, p.PendingEventCount(), p.HasPendingPublication())
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
	if tail == nil {
		t.Fatal("BarrierSnapshot tail = nil, want the pending window")
	}
	if !slices.Equal(words, p.Words()) {
		t.Fatal("snapshot copy differs from the state after the tail")
	}
	applyBatch(consumer, tail)
	if !slices.Equal(consumer, words) {
		t.Fatal("old stream plus tail differs from the snapshot copy")
	}
	if p.HasPendingPublication() || p.PendingEventCount() != 0 {
		t.Fatal("BarrierSnapshot did not drain the window")
	}
	clear(words)
	if !p.Contains(chain(20)[0]) {
		t.Fatal("mutating the snapshot copy changed the pool")
	}
	if tail2, w2 := p.BarrierSnapshot(); tail2 != nil || !slices.Equal(w2, p.Words()) {
		t.Fatalf("second BarrierSnapshot tail = %+v, want nil and the same words", tail2)
	}
}

func TestPool_RemoveRank(t *testing.T) {
	p := newTestPool(t, 1000, 100, DefaultMaxKicks)
	p.ApplyEvent(rootEv(mA, b(1, 10), b(2, 11)))
	p.ApplyEvent(rootEv(mB, b(1, 10)))
	p.Flush()
	consumer := p.Words()
	p.ApplyEvent(rootEv(mB, b(3, 30))) // pending, not published
	batch, err := p.RemoveRank(mA)
	if err != nil {
		t.Fatalf("RemoveRank error = %v", err)
	}
	checkBatch(t, batch, p.Format().BucketCount)
	applyBatch(consumer, batch)
	if !slices.Equal(consumer, p.Words()) {
		t.Fatal("RemoveRank batch (unconditional drain) does not bring the consumer to the words")
	}
	if got := p.MemberCounts(); !slices.Equal(got, []MemberCount{{mB, 2}}) {
		t.Fatalf("MemberCounts = %+v, want only mB with 2", got)
	}
	if owners, res := p.Owners(chain(10)[0]); owners != 1 || !res {
		t.Fatalf("shared root Owners = %d, %v; want 1, true", owners, res)
	}
	if p.Contains(chain(10, 11)[1]) {
		t.Fatal("mA's exclusive block still present")
	}
	if batch, err := p.RemoveRank(Member{WorkerID: 99}); batch != nil || err != nil {
		t.Fatalf("RemoveRank(unknown) = %+v, %v; want nil, nil", batch, err)
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
	if p.t.addr.Address(k1) != p.t.addr.Address(k2) {
		t.Fatalf("search found %d and %d with different addresses", k1, k2)
	}
	// Roots: canonical = tokens hash.
	p.ApplyEvent(rootEv(mA, b(1, k1)))
	p.ApplyEvent(rootEv(mB, b(2, k2)))
	if s := p.Stats(); s.OccupiedSlots != 2 || s.ResidentBlocks != 2 {
		t.Fatalf("two colliding blocks occupy %d slots (%d resident), want 2", s.OccupiedSlots, s.ResidentBlocks)
	}
	p.ApplyEvent(removedEv(mA, 1))
	if !p.Contains(k2) || p.Stats().OccupiedSlots != 1 {
		t.Fatalf("after removing one owner Contains(k2) = %v, slots = %d; want true, 1", p.Contains(k2), p.Stats().OccupiedSlots)
	}
	if owners, res := p.Owners(k2); owners != 1 || !res {
		t.Fatalf("k2 Owners = %d, %v; want 1, true", owners, res)
	}
	// Removing k1 again is an unknown removal: the state never deletes by fingerprint alone.
	if out := p.ApplyEvent(removedEv(mA, 1)); out.UnknownRemovals != 1 || !p.Contains(k2) {
		t.Fatalf("repeated removal: unknown %d, Contains(k2) %v; want 1, true", out.UnknownRemovals, p.Contains(k2))
	}
	p.ApplyEvent(removedEv(mB, 2))
	if p.Contains(k1) || p.Contains(k2) || p.Stats().OccupiedSlots != 0 {
		t.Fatal("fingerprint present after both owners left")
	}
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
	if !errors.Is(out.FirstError, ErrCapacityExhausted) {
		t.Fatalf("FirstError = %v, want ErrCapacityExhausted", out.FirstError)
	}
	if out.Batch != nil || p.HasPendingPublication() {
		t.Fatalf("failed relocation published %+v / left a window; want nothing dirty", out.Batch)
	}
	if !slices.Equal(p.Words(), words) {
		t.Fatal("words changed after a failed relocation")
	}
	after := p.Stats()
	if after.PhysicalTouches != before.PhysicalTouches || after.DistinctTouchedBuckets != before.DistinctTouchedBuckets {
		t.Fatalf("touch counters moved: before %+v after %+v", before, after)
	}
	if owners, res := p.Owners(77); owners != 1 || res {
		t.Fatalf("omitted block Owners = %d, %v; want 1, false", owners, res)
	}
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
	if got := p.MemberCounts(); !slices.Equal(got, want) {
		t.Fatalf("MemberCounts = %+v, want %+v", got, want)
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
		if c.got != c.want {
			t.Errorf("Stats.%s = %d, want %d", c.name, c.got, c.want)
		}
	}
	if s.OccupiedBuckets < 1 || s.OccupiedBuckets > 6 {
		t.Errorf("OccupiedBuckets = %d, want 1..6", s.OccupiedBuckets)
	}
	if s.DistinctTouchedBuckets < uint64(s.OccupiedBuckets) || s.EmittedImages < uint64(s.OccupiedBuckets) {
		t.Errorf("DistinctTouched %d, Emitted %d; want ≥ occupied buckets %d", s.DistinctTouchedBuckets, s.EmittedImages, s.OccupiedBuckets)
	}
	if s.DirtyTrackingBytes < nb*4 || s.ExactStateBytes == 0 {
		t.Errorf("DirtyTrackingBytes %d (want ≥ %d), ExactStateBytes %d (want > 0)", s.DirtyTrackingBytes, nb*4, s.ExactStateBytes)
	}
}

func TestNewPool_FormatAndConfig(t *testing.T) {
	c := DefaultConfig()
	c.ExpectedBlocks = 32
	c.Seed = 5
	p, err := NewPool(c)
	if err != nil {
		t.Fatal(err)
	}
	if p.Config() != c || p.Format() != NewFormat(5, 16) || len(p.Words()) != 16 {
		t.Fatalf("Config %+v Format %+v words %d; want the config, 16 buckets seed 5", p.Config(), p.Format(), len(p.Words()))
	}
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
	if !errors.As(out.FirstError, &ee) || !errors.Is(out.FirstError, ErrIndexerInvariantViolation) || ee.BlockHash != chain(10)[0] {
		t.Fatalf("FirstError = %v, want IndexerInvariantViolation for the canonical hash", out.FirstError)
	}
	if d, _ := DispositionOf(FailurePointOf(out.FirstError)); d.Action != FenceAndRebuildProducer {
		t.Fatalf("disposition = %+v, want FenceAndRebuildProducer", d)
	}
	if out.Batch != nil {
		t.Fatalf("invariant violation published %+v", out.Batch)
	}
}

// TestPool_OwnershipDegreeOverflow: a block at the maximum owner count is
// skipped for the new owner (no lineage, no ownership) and reported.
func TestPool_OwnershipDegreeOverflow(t *testing.T) {
	p := newTestPool(t, 1000, 1, DefaultMaxKicks)
	p.ApplyEvent(rootEv(mA, b(1, 10)))
	c := chain(10)[0]
	st := p.blocks[c]
	st.owners = 1<<32 - 1
	p.blocks[c] = st
	out := p.ApplyEvent(rootEv(mB, b(2, 10), b(3, 11)))
	if !errors.Is(out.FirstError, ErrOwnershipDegreeOverflow) {
		t.Fatalf("FirstError = %v, want ErrOwnershipDegreeOverflow", out.FirstError)
	}
	if FailurePointOf(out.FirstError) != SourceProtocolFailure {
		t.Fatalf("failure point = %v, want SourceProtocolFailure", FailurePointOf(out.FirstError))
	}
	if owners, _ := p.Owners(c); owners != 1<<32-1 {
		t.Fatalf("owners = %d, want unchanged max", owners)
	}
	if got := p.MemberCounts(); !slices.Equal(got, []MemberCount{{mA, 1}, {mB, 1}}) {
		t.Fatalf("MemberCounts = %+v, want mB holding only its second block", got)
	}
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
			if err != nil {
				t.Fatalf("ReplaceRanks error = %v", err)
			}
			return b
		},
		func() *Batch { return p.ApplyEvent(clearedEv(mC)).Batch },
		func() *Batch { return p.Flush() },
	}
	for i, op := range ops {
		batch := op()
		checkBatch(t, batch, p.Format().BucketCount)
		applyBatch(consumer, batch)
		if !p.HasPendingPublication() && !slices.Equal(consumer, p.Words()) {
			t.Fatalf("op %d: snapshot + batches %#x, producer %#x", i, consumer, p.Words())
		}
	}
	if !slices.Equal(consumer, p.Words()) {
		t.Fatal("after the final flush the consumer differs from the producer")
	}
}
