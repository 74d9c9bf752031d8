package ckf

import (
	"errors"
	"slices"
	"testing"
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
			if !errors.Is(err, tc.want) || batch != nil {
				t.Fatalf("ReplaceRanks = %+v, %v; want nil, %v", batch, err, tc.want)
			}
			var ee *EventError
			if !errors.As(err, &ee) {
				t.Fatalf("error %v is not an *EventError", err)
			}
			if after := viewOf(p); !after.equal(before) {
				t.Fatalf("failed replacement changed the pool:\n before %+v\n after  %+v", before, after)
			}
			if p.t.rng.State() != rng {
				t.Fatal("failed replacement changed the RNG")
			}
			if p.PendingEventCount() != 1 {
				t.Fatalf("PendingEventCount = %d, want 1", p.PendingEventCount())
			}
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
		if seen[a] {
			t.Fatalf("test precondition: keys share bucket %d; pick other tokens", a)
		}
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
	if err != nil || batch != nil {
		t.Fatalf("ReplaceRanks = %+v, %v; want nil, nil", batch, err)
	}
	after := viewOf(p)
	if !slices.Equal(after.words, before.words) || !slices.Equal(after.counts, before.counts) {
		t.Fatalf("replacement changed the words or counts")
	}
	for _, h := range chain(10, 11) {
		if owners, res := p.Owners(h); owners != 2 || !res {
			t.Fatalf("Owners(%#x) = %d, %v; want 2, true", h, owners, res)
		}
	}
}

func TestPool_ReplaceDiffIncludesPendingWindow(t *testing.T) {
	p := newTestPool(t, 1000, 100, DefaultMaxKicks)
	p.ApplyEvent(rootEv(mA, b(1, 10)))
	p.Flush()
	consumer := p.Words()
	p.ApplyEvent(rootEv(mA, b(2, 20))) // pending: consumers have not seen it
	batch, err := p.ReplaceRanks([]RankReplacement{{mB, events(rootEv(mB, b(3, 30)))}})
	if err != nil {
		t.Fatalf("ReplaceRanks error = %v", err)
	}
	checkBatch(t, batch, p.Format().BucketCount)
	a20 := p.t.addr.Address(chain(20)[0])
	if !slices.ContainsFunc(batch.Images, func(im BucketImage) bool {
		return (uint64(im.Bucket) == a20.A || uint64(im.Bucket) == a20.B) && (Bucket(im.Word).Contains(a20.Fingerprint))
	}) {
		t.Fatalf("replacement batch %+v lacks the pending window's block", batch.Images)
	}
	applyBatch(consumer, batch)
	if !slices.Equal(consumer, p.Words()) {
		t.Fatal("consumer + replacement batch differs from the producer")
	}
	if p.HasPendingPublication() || p.PendingEventCount() != 0 {
		t.Fatal("replacement left a pending window")
	}
	for _, h := range []uint64{chain(10)[0], chain(20)[0], chain(30)[0]} {
		if !p.Contains(h) {
			t.Fatalf("Contains(%#x) = false after replacement", h)
		}
	}
}

func TestPool_RebuildBackToPublishedStatePublishesNothing(t *testing.T) {
	p := newTestPool(t, 1000, 100, DefaultMaxKicks)
	p.ApplyEvent(rootEv(mA, b(1, 10)))
	p.Flush()
	published := p.Words()
	p.ApplyEvent(removedEv(mA, 1)) // pending: the block is gone locally
	if slices.Equal(p.Words(), published) {
		t.Fatal("test precondition: the pending removal did not change the words")
	}
	batch, err := p.ReplaceRanks([]RankReplacement{{mA, events(rootEv(mA, b(1, 10)))}})
	if err != nil || batch != nil {
		t.Fatalf("ReplaceRanks = %+v, %v; want nil, nil (consumers already hold this)", batch, err)
	}
	if !slices.Equal(p.Words(), published) || p.HasPendingPublication() || p.PendingEventCount() != 0 {
		t.Fatal("rebuild did not return to the published words with an empty window")
	}
}

func TestPool_ReplaceEmptyListRemovesMember(t *testing.T) {
	p := newTestPool(t, 1000, 1, DefaultMaxKicks)
	p.ApplyEvent(rootEv(mA, b(1, 10)))
	p.ApplyEvent(rootEv(mB, b(2, 20)))
	consumer := p.Words()
	batch, err := p.ReplaceRanks([]RankReplacement{{mA, nil}, {Member{WorkerID: 77}, nil}})
	if err != nil || batch == nil {
		t.Fatalf("ReplaceRanks = %+v, %v; want a batch", batch, err)
	}
	applyBatch(consumer, batch)
	if !slices.Equal(consumer, p.Words()) {
		t.Fatal("consumer + batch differs")
	}
	if got := p.MemberCounts(); !slices.Equal(got, []MemberCount{{mB, 1}}) {
		t.Fatalf("MemberCounts = %+v, want only mB", got)
	}
	if p.Contains(chain(10)[0]) {
		t.Fatal("removed member's block still present")
	}
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
	if err != nil {
		t.Fatalf("ReplaceRanks error = %v", err)
	}
	checkBatch(t, batch, 4)
	applyBatch(consumer, batch)
	if !slices.Equal(consumer, p.Words()) {
		t.Fatal("one replacement batch does not bring the consumer to the words")
	}
	fresh := newTestPool(t, 7, 1, kicks)
	for i := range repA {
		fresh.ApplyEvent(&repA[i])
	}
	for i := range repB {
		fresh.ApplyEvent(&repB[i])
	}
	if !slices.Equal(p.Words(), fresh.Words()) || p.t.rng.State() != fresh.t.rng.State() {
		t.Fatalf("batched rebuild words %#x rng %#x, fresh replay %#x rng %#x; want equal (one rebuild, RNG restarted once)",
			p.Words(), p.t.rng.State(), fresh.Words(), fresh.t.rng.State())
	}
	if initial := NewRNG(DefaultSeed); fresh.t.rng.State() == initial.State() {
		t.Fatal("test precondition: the replay made no relocation draws")
	}
	if !slices.Equal(p.MemberCounts(), fresh.MemberCounts()) {
		t.Fatalf("MemberCounts %+v, fresh %+v", p.MemberCounts(), fresh.MemberCounts())
	}
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
	if err != nil {
		t.Fatalf("ReplaceRanks error = %v", err)
	}
	after := viewOf(p)
	if slices.Equal(after.words, before.words) || batch == nil {
		t.Fatal("rebuild reproduced the bytes; expected slot churn from canonical-order reinstall")
	}
	if !slices.Equal(after.counts, before.counts) {
		t.Fatalf("MemberCounts %+v, want %+v", after.counts, before.counts)
	}
	for _, h := range []uint64{lo, hi} {
		if owners, res := p.Owners(h); owners != 1 || !res || !p.Contains(h) {
			t.Fatalf("Owners(%#x) = %d, %v; want 1, true", h, owners, res)
		}
	}
	applyBatch(consumer, batch)
	if !slices.Equal(consumer, p.Words()) {
		t.Fatal("consumer + churn batch differs")
	}
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
	if err != nil {
		t.Fatalf("capacity omission during rebuild was fatal: %v", err)
	}
	s := p.Stats()
	if s.UnknownRemovals != before.UnknownRemovals || s.ParentNotFound != before.ParentNotFound {
		t.Fatalf("lifetime counters not carried: before %+v after %+v", before, s)
	}
	if s.CapacityFailures != before.CapacityFailures+2 || s.ResidentBlocks != 8 || s.OccupiedSlots != 8 || s.UniqueBlocks != 10 {
		t.Fatalf("stats = %+v, want 2 more capacity failures, 8 resident of 10", s)
	}
	if batch == nil || s.EmittedImages != before.EmittedImages+uint64(len(batch.Images)) {
		t.Fatalf("EmittedImages = %d, want %d + %d", s.EmittedImages, before.EmittedImages, len(batch.Images))
	}
	if s.PendingEvents != 0 {
		t.Fatalf("PendingEvents = %d, want 0", s.PendingEvents)
	}
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
	if err != nil {
		t.Fatalf("device-only ReplaceRanks: %v", err)
	}
	gotBatch, err := got.ReplaceRanks([]RankReplacement{{mA, mixed}})
	if err != nil {
		t.Fatalf("ReplaceRanks with non-device Stored events = %v, want nil", err)
	}
	if gotBatch == nil || wantBatch == nil || !slices.Equal(gotBatch.Images, wantBatch.Images) {
		t.Fatalf("batch = %+v, want the device-only replacement's %+v", gotBatch, wantBatch)
	}
	if g, w := viewOf(got), viewOf(want); !g.equal(w) {
		t.Fatalf("pool after mixed dump = %+v, want device-only %+v", g, w)
	}
	if g, w := got.t.rng.State(), want.t.rng.State(); g != w {
		t.Fatalf("RNG state = %#x, want %#x", g, w)
	}
	if c := got.MemberCounts(); !slices.Equal(c, []MemberCount{{mA, 2}, {mB, 1}}) {
		t.Fatalf("MemberCounts = %+v, want mA 2, mB 1", c)
	}
	for _, h := range []uint64{50, ChainHash(chain(10)[0], 60), 80} {
		if owners, _ := got.Owners(h); owners != 0 {
			t.Errorf("Owners(%#x) = %d: a non-device block was installed", h, owners)
		}
	}
	for _, h := range chain(10, 11) {
		if owners, res := got.Owners(h); owners != 1 || !res {
			t.Errorf("Owners(%#x) = %d, %v; want 1, true", h, owners, res)
		}
	}
}
