package ckf

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func events(evs ...*RouterEvent) []RouterEvent {
	out := make([]RouterEvent, len(evs))
	for i, e := range evs {
		out[i] = *e
	}
	return out
}

func TestPool_ReplaceRanksFailurePreservesState(t *testing.T) {
	cases := []struct {
		name string
		reps []RankReplacement
		want error
	}{
		{"duplicate member", []RankReplacement{{mA, nil}, {mA, nil}}, ErrInvalidReplacement},
		{"event of another member", []RankReplacement{{mA, events(rootEv(mB, b(1, 1)))}}, ErrInvalidReplacement},
		{"removed event", []RankReplacement{{mA, events(removedEv(mA, 1))}}, ErrInvalidReplacement},
		{"cleared event", []RankReplacement{{mA, events(clearedEv(mA))}}, ErrInvalidReplacement},
		{"unknown tier", []RankReplacement{{mA, events(onTier(rootEv(mA, b(1, 1)), TierExternal+1))}}, ErrUnsupportedResidencyDomain},
		{"unknown kind", []RankReplacement{{mA, events(onTier(&RouterEvent{WorkerID: mA.WorkerID, DPRank: mA.DPRank, Kind: EventCleared + 1}, TierDisk))}}, ErrMalformedEvent},
		{"parent only on a non-device tier", []RankReplacement{{mA, events(onTier(rootEv(mA, b(1, 10)), TierHostPinned), childEv(mA, 1, b(2, 11)))}}, ErrParentBlockNotFound},
		{"parent not found", []RankReplacement{{mA, events(rootEv(mA, b(1, 10)), childEv(mA, 5, b(2, 11)))}}, ErrParentBlockNotFound},
		{"parent from the old state only", []RankReplacement{{mA, events(childEv(mA, 1, b(9, 11)))}}, ErrParentBlockNotFound},
		{"duplicate external hash", []RankReplacement{{mA, events(rootEv(mA, b(1, 10), b(1, 11)))}}, ErrInvalidBlockSequence},
		{"remap across events", []RankReplacement{{mA, events(rootEv(mA, b(1, 10)), rootEv(mA, b(1, 12)))}}, ErrInvalidBlockSequence},
		{"root with start_position", []RankReplacement{{mA, func() []RouterEvent {
			ev := rootEv(mA, b(1, 10))
			ev.HasStartPosition, ev.StartPosition = true, 3
			return events(ev)
		}()}}, ErrInvalidBlockSequence},
		{"good member then bad member", []RankReplacement{{mB, nil}, {mC, events(childEv(mC, 42, b(1, 1)))}}, ErrParentBlockNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPool(t, 1000, 100, DefaultMaxKicks)
			p.ApplyEvent(rootEv(mA, b(1, 10), b(2, 11)))
			p.ApplyEvent(rootEv(mB, b(7, 70)))
			p.Flush()
			p.ApplyEvent(rootEv(mB, b(8, 80))) // a pending window must survive too
			before := viewOf(p)
			rng := p.t.rng.State()
			batch, err := p.ReplaceRanks(tc.reps)
			require.ErrorIs(t, err, tc.want, "ReplaceRanks = %+v, %v; want nil, %v", batch, err, tc.want)
			require.Nil(t, batch, "ReplaceRanks = %+v, %v; want nil, %v", batch, err, tc.want)
			var ee *EventError
			require.ErrorAs(t, err, &ee, "error %v is not an *EventError", err)
			after := viewOf(p)
			require.True(t, after.equal(before), "failed replacement changed the pool:\n before %+v\n after  %+v", before, after)
			require.Equal(t, rng, p.t.rng.State(), "failed replacement changed the RNG")
			require.Equal(t, uint64(1), p.PendingEventCount(), "PendingEventCount = %d, want 1", p.PendingEventCount())
		})
	}
}

// distinctA fails the test unless the keys have pairwise distinct first
// buckets: then the slot layout does not depend on insertion order and a
// rebuild reproduces the bytes.
func distinctA(t *testing.T, p *Pool, keys ...uint64) {
	t.Helper()
	seen := map[uint64]bool{}
	for _, k := range keys {
		a := p.t.addr.Address(k).A
		require.False(t, seen[a], "test precondition: keys share bucket %d; pick other tokens", a)
		seen[a] = true
	}
}

func TestPool_ReplaceOneOfTwoSharedOwnersPublishesNothing(t *testing.T) {
	p := newTestPool(t, 1000, 1, DefaultMaxKicks)
	distinctA(t, p, chain(10, 11)...)
	p.ApplyEvent(rootEv(mA, b(1, 10), b(2, 11)))
	p.ApplyEvent(rootEv(mB, b(5, 10), b(6, 11)))
	before := viewOf(p)
	batch, err := p.ReplaceRanks([]RankReplacement{{mB, events(rootEv(mB, b(5, 10)), childEv(mB, 5, b(6, 11)))}})
	require.NoError(t, err, "ReplaceRanks = %+v, %v; want nil, nil", batch, err)
	require.Nil(t, batch, "ReplaceRanks = %+v, %v; want nil, nil", batch, err)
	after := viewOf(p)
	require.True(t, slices.Equal(after.words, before.words), "replacement changed the words or counts")
	require.True(t, slices.Equal(after.counts, before.counts), "replacement changed the words or counts")
	for _, h := range chain(10, 11) {
		owners, res := p.Owners(h)
		require.Equal(t, uint32(2), owners, "Owners(%#x) = %d, %v; want 2, true", h, owners, res)
		require.True(t, res, "Owners(%#x) = %d, %v; want 2, true", h, owners, res)
	}
}

func TestPool_ReplaceDiffIncludesPendingWindow(t *testing.T) {
	p := newTestPool(t, 1000, 100, DefaultMaxKicks)
	p.ApplyEvent(rootEv(mA, b(1, 10)))
	p.Flush()
	consumer := p.Words()
	p.ApplyEvent(rootEv(mA, b(2, 20))) // pending: consumers have not seen it
	batch, err := p.ReplaceRanks([]RankReplacement{{mB, events(rootEv(mB, b(3, 30)))}})
	require.NoError(t, err, "ReplaceRanks error")
	checkBatch(t, batch, p.Format().BucketCount)
	a20 := p.t.addr.Address(chain(20)[0])
	require.True(t, slices.ContainsFunc(batch.Images, func(im BucketImage) bool {
		return (uint64(im.Bucket) == a20.A || uint64(im.Bucket) == a20.B) && (Bucket(im.Word).Contains(a20.Fingerprint))
	}), "replacement batch %+v lacks the pending window's block", batch.Images)
	applyBatch(consumer, batch)
	require.True(t, slices.Equal(consumer, p.Words()), "consumer + replacement batch differs from the producer")
	require.False(t, p.HasPendingPublication(), "replacement left a pending window")
	require.Equal(t, uint64(0), p.PendingEventCount(), "replacement left a pending window")
	for _, h := range []uint64{chain(10)[0], chain(20)[0], chain(30)[0]} {
		require.True(t, p.Contains(h), "Contains(%#x) = false after replacement", h)
	}
}

func TestPool_RebuildBackToPublishedStatePublishesNothing(t *testing.T) {
	p := newTestPool(t, 1000, 100, DefaultMaxKicks)
	p.ApplyEvent(rootEv(mA, b(1, 10)))
	p.Flush()
	published := p.Words()
	p.ApplyEvent(removedEv(mA, 1)) // pending: the block is gone locally
	require.False(t, slices.Equal(p.Words(), published), "test precondition: the pending removal did not change the words")
	batch, err := p.ReplaceRanks([]RankReplacement{{mA, events(rootEv(mA, b(1, 10)))}})
	require.NoError(t, err, "ReplaceRanks = %+v, %v; want nil, nil (consumers already hold this)", batch, err)
	require.Nil(t, batch, "ReplaceRanks = %+v, %v; want nil, nil (consumers already hold this)", batch, err)
	require.True(t, slices.Equal(p.Words(), published), "rebuild did not return to the published words with an empty window")
	require.False(t, p.HasPendingPublication(), "rebuild did not return to the published words with an empty window")
	require.Equal(t, uint64(0), p.PendingEventCount(), "rebuild did not return to the published words with an empty window")
}

func TestPool_ReplaceEmptyListRemovesMember(t *testing.T) {
	p := newTestPool(t, 1000, 1, DefaultMaxKicks)
	p.ApplyEvent(rootEv(mA, b(1, 10)))
	p.ApplyEvent(rootEv(mB, b(2, 20)))
	consumer := p.Words()
	batch, err := p.ReplaceRanks([]RankReplacement{{mA, nil}, {Member{WorkerID: 77}, nil}})
	require.NoError(t, err, "ReplaceRanks = %+v, %v; want a batch", batch, err)
	require.NotNil(t, batch, "ReplaceRanks = %+v, %v; want a batch", batch, err)
	applyBatch(consumer, batch)
	require.True(t, slices.Equal(consumer, p.Words()), "consumer + batch differs")
	got := p.MemberCounts()
	require.True(t, slices.Equal(got, []MemberCount{{mB, 1}}), "MemberCounts = %+v, want only mB", got)
	require.False(t, p.Contains(chain(10)[0]), "removed member's block still present")
}

// TestPool_BatchedReplacementRebuildsOnce: replacing every member in one
// call is one rebuild from a restarted RNG, byte-identical to a fresh pool
// fed the replacements in order, and publishes one batch.
func TestPool_BatchedReplacementRebuildsOnce(t *testing.T) {
	const kicks = 20
	p := newTestPool(t, 7, 1, kicks) // 4 buckets, 16 slots: relocations happen
	consumer := p.Words()
	repA := events(rootEv(mA, b(1, 1), b(2, 2), b(3, 3), b(4, 4), b(5, 5), b(6, 6)))
	repB := events(rootEv(mB, b(1, 11), b(2, 12), b(3, 13)), childEv(mB, 3, b(4, 14), b(5, 15), b(6, 16), b(7, 17), b(8, 18), b(9, 19), b(10, 20), b(11, 21)))
	// Different history before: mA and mB hold other blocks, mC too.
	for _, ev := range []*RouterEvent{rootEv(mA, b(9, 90), b(8, 91)), rootEv(mB, b(9, 92)), rootEv(mC, b(1, 93))} {
		applyBatch(consumer, p.ApplyEvent(ev).Batch)
	}
	batch, err := p.ReplaceRanks([]RankReplacement{{mA, repA}, {mB, repB}, {mC, nil}})
	require.NoError(t, err, "ReplaceRanks error")
	checkBatch(t, batch, 4)
	applyBatch(consumer, batch)
	require.True(t, slices.Equal(consumer, p.Words()), "one replacement batch does not bring the consumer to the words")
	fresh := newTestPool(t, 7, 1, kicks)
	for i := range repA {
		fresh.ApplyEvent(&repA[i])
	}
	for i := range repB {
		fresh.ApplyEvent(&repB[i])
	}
	require.True(t, slices.Equal(p.Words(), fresh.Words()), "batched rebuild words %#x rng %#x, fresh replay %#x rng %#x; want equal (one rebuild, RNG restarted once)", p.Words(), p.t.rng.State(), fresh.Words(), fresh.t.rng.State())
	require.Equal(t, fresh.t.rng.State(), p.t.rng.State(), "batched rebuild words %#x rng %#x, fresh replay %#x rng %#x; want equal (one rebuild, RNG restarted once)", p.Words(), p.t.rng.State(), fresh.Words(), fresh.t.rng.State())
	initial := NewRNG(DefaultSeed)
	require.NotEqual(t, initial.State(), fresh.t.rng.State(), "test precondition: the replay made no relocation draws")
	require.True(t, slices.Equal(p.MemberCounts(), fresh.MemberCounts()), "MemberCounts %+v, fresh %+v", p.MemberCounts(), fresh.MemberCounts())
}

// TestPool_ReplayChurnEqualOwnershipNotBytes: a rebuild reinstalls retained
// blocks in canonical order, so the same ownership can land in other slots.
// Consumers follow through the diff batch.
func TestPool_ReplayChurnEqualOwnershipNotBytes(t *testing.T) {
	p := newTestPool(t, 1000, 1, DefaultMaxKicks)
	ks := keysSameA(p.t.addr, 1, 2) // ascending, one bucket
	lo, hi := ks[0], ks[1]
	if p.t.addr.Address(lo).Fingerprint == p.t.addr.Address(hi).Fingerprint {
		t.Skip("equal fingerprints cannot show slot churn")
	}
	consumer := p.Words()
	applyBatch(consumer, p.ApplyEvent(rootEv(mA, b(1, hi))).Batch) // the larger canonical first
	applyBatch(consumer, p.ApplyEvent(rootEv(mB, b(2, lo))).Batch)
	before := viewOf(p)
	batch, err := p.ReplaceRanks(nil) // rebuild everything, replace nobody
	require.NoError(t, err, "ReplaceRanks error")
	after := viewOf(p)
	require.False(t, slices.Equal(after.words, before.words), "rebuild reproduced the bytes; expected slot churn from canonical-order reinstall")
	require.NotNil(t, batch, "rebuild reproduced the bytes; expected slot churn from canonical-order reinstall")
	require.True(t, slices.Equal(after.counts, before.counts), "MemberCounts %+v, want %+v", after.counts, before.counts)
	for _, h := range []uint64{lo, hi} {
		owners, res := p.Owners(h)
		require.Equal(t, uint32(1), owners, "Owners(%#x) = %d, %v; want 1, true", h, owners, res)
		require.True(t, res, "Owners(%#x) = %d, %v; want 1, true", h, owners, res)
		require.True(t, p.Contains(h), "Owners(%#x) = %d, %v; want 1, true", h, owners, res)
	}
	applyBatch(consumer, batch)
	require.True(t, slices.Equal(consumer, p.Words()), "consumer + churn batch differs")
}

func TestPool_ReplaceCarriesStatsAndCountsOmissions(t *testing.T) {
	p := newTestPool(t, 1, 100, 4) // 8 slots
	p.ApplyEvent(removedEv(mA, 42))
	p.ApplyEvent(childEv(mA, 42, b(1, 1)))
	var blocks []StoredBlock
	for i := uint64(1); i <= 10; i++ {
		blocks = append(blocks, b(i, i))
	}
	before := p.Stats()
	batch, err := p.ReplaceRanks([]RankReplacement{{mA, events(rootEv(mA, blocks...))}})
	require.NoError(t, err, "capacity omission during rebuild was fatal")
	s := p.Stats()
	require.Equal(t, before.UnknownRemovals, s.UnknownRemovals, "lifetime counters not carried: before %+v after %+v", before, s)
	require.Equal(t, before.ParentNotFound, s.ParentNotFound, "lifetime counters not carried: before %+v after %+v", before, s)
	require.Equal(t, before.CapacityFailures+2, s.CapacityFailures, "stats = %+v, want 2 more capacity failures, 8 resident of 10", s)
	require.Equal(t, uint64(8), s.ResidentBlocks, "stats = %+v, want 2 more capacity failures, 8 resident of 10", s)
	require.Equal(t, 8, s.OccupiedSlots, "stats = %+v, want 2 more capacity failures, 8 resident of 10", s)
	require.Equal(t, 10, s.UniqueBlocks, "stats = %+v, want 2 more capacity failures, 8 resident of 10", s)
	require.NotNil(t, batch, "EmittedImages = %d, want %d + the batch's images", s.EmittedImages, before.EmittedImages)
	require.Equal(t, before.EmittedImages+uint64(len(batch.Images)), s.EmittedImages, "EmittedImages = %d, want %d + %d", s.EmittedImages, before.EmittedImages, len(batch.Images))
	require.Equal(t, uint64(0), s.PendingEvents, "PendingEvents = %d, want 0", s.PendingEvents)
}

// TestPool_ReplaceSkipsNonDeviceEvents: a tree dump may carry events of
// other tiers; like ApplyEvent and Dynamo's relay, ReplaceRanks skips them. The result equals
// the same replacement without them (words, counts, statistics, RNG), their
// blocks are neither owned nor present, and the device events around them
// install.
func TestPool_ReplaceSkipsNonDeviceEvents(t *testing.T) {
	setup := func() *Pool {
		p := newTestPool(t, 1000, 1, DefaultMaxKicks)
		p.ApplyEvent(rootEv(mA, b(1, 10)))
		p.ApplyEvent(rootEv(mB, b(7, 70)))
		return p
	}
	device := events(rootEv(mA, b(1, 10)), childEv(mA, 1, b(2, 11)))
	mixed := events(
		onTier(rootEv(mA, b(5, 50)), TierDisk),
		onTier(removedEv(mA, 1), TierDisk),
		rootEv(mA, b(1, 10)),
		onTier(clearedEv(mA), TierHostPinned),
		onTier(childEv(mA, 1, b(6, 60)), TierHostPinned),
		childEv(mA, 1, b(2, 11)),
		onTier(rootEv(mA, b(8, 80)), TierExternal),
	)
	want, got := setup(), setup()
	wantBatch, err := want.ReplaceRanks([]RankReplacement{{mA, device}})
	require.NoError(t, err, "device-only ReplaceRanks")
	gotBatch, err := got.ReplaceRanks([]RankReplacement{{mA, mixed}})
	require.NoError(t, err, "ReplaceRanks with non-device Stored events = %v, want nil", err)
	require.NotNil(t, gotBatch, "batch = %+v, want the device-only replacement's %+v", gotBatch, wantBatch)
	require.NotNil(t, wantBatch, "batch = %+v, want the device-only replacement's %+v", gotBatch, wantBatch)
	require.True(t, slices.Equal(gotBatch.Images, wantBatch.Images), "batch = %+v, want the device-only replacement's %+v", gotBatch, wantBatch)
	g, w := viewOf(got), viewOf(want)
	require.True(t, g.equal(w), "pool after mixed dump = %+v, want device-only %+v", g, w)
	{
		g, w := got.t.rng.State(), want.t.rng.State()
		require.Equal(t, w, g, "RNG state = %#x, want %#x", g, w)
	}
	c := got.MemberCounts()
	require.True(t, slices.Equal(c, []MemberCount{{mA, 2}, {mB, 1}}), "MemberCounts = %+v, want mA 2, mB 1", c)
	for _, h := range []uint64{50, ChainHash(chain(10)[0], 60), 80} {
		owners, _ := got.Owners(h)
		assert.Equal(t, uint32(0), owners, "Owners(%#x) = %d: a non-device block was installed", h, owners)
	}
	for _, h := range chain(10, 11) {
		owners, res := got.Owners(h)
		assert.False(t, owners != 1 || !res, "Owners(%#x) = %d, %v; want 1, true", h, owners, res)
	}
}
