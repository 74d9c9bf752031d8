package ckf

import (
	"errors"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Tests pinning the pool decisions of SPEC §4 (marked **Decision** there)
// and the exact-state bounds of SPEC §4.6.

// fullTinyPool returns a 2-bucket pool (8 slots, every key's candidates are
// buckets 0 and 1) in which member mA stored keys 1..9 as one-block root
// events: 1..8 are resident and fill the table, 9 is tracked non-resident.
func fullTinyPool(t *testing.T) *Pool {
	t.Helper()
	p := newTestPool(t, 1, 1, 1)
	for k := uint64(1); k <= 9; k++ {
		out := p.ApplyEvent(rootEv(mA, b(k, k)))
		if k <= 8 {
			require.NoError(t, out.FirstError, "key %d", k)
		} else {
			require.ErrorIs(t, out.FirstError, ErrCapacityExhausted)
		}
	}
	owners, resident := p.Owners(9)
	require.Equal(t, uint32(1), owners)
	require.False(t, resident)
	require.Equal(t, uint64(8), p.Stats().ResidentBlocks)
	return p
}

// TestPool_StoreOfNonResidentBlockReoffers: any Stored naming a tracked
// non-resident block re-offers it — a repeat by its owner or a store by
// another member alike — into an empty slot only; a failed re-offer is a
// capacity failure reported as the event's CapacityExhausted, and the rest
// of the event (the new ownership) still applies (decision 1).
func TestPool_StoreOfNonResidentBlockReoffers(t *testing.T) {
	tests := []struct {
		name       string
		by         Member
		freeSlot   bool // remove key 1 first, freeing one slot
		wantErr    error
		wantOwners uint32
		resident   bool
	}{
		{"owner repeats, table full", mA, false, ErrCapacityExhausted, 1, false},
		{"second member, table full", mB, false, ErrCapacityExhausted, 2, false},
		{"owner repeats, slot free", mA, true, nil, 1, true},
		{"second member, slot free", mB, true, nil, 2, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := fullTinyPool(t)
			if tt.freeSlot {
				require.NoError(t, p.ApplyEvent(removedEv(mA, 1)).FirstError)
			}
			before := p.Words()
			failures := p.Stats().CapacityFailures
			out := p.ApplyEvent(rootEv(tt.by, b(9, 9)))
			if tt.wantErr != nil {
				require.ErrorIs(t, out.FirstError, tt.wantErr)
				assert.Equal(t, failures+1, p.Stats().CapacityFailures, "a failed re-offer counts as a capacity failure")
				assert.Equal(t, before, p.Words(), "a failed re-offer relocates nothing")
			} else {
				require.NoError(t, out.FirstError)
				assert.Equal(t, failures, p.Stats().CapacityFailures)
			}
			owners, resident := p.Owners(9)
			assert.Equal(t, tt.wantOwners, owners)
			assert.Equal(t, tt.resident, resident)
			assert.Equal(t, tt.resident, p.Contains(9))
		})
	}
}

// TestPool_StoredHeaderIsCheckedWhateverTheBlockCount: a null parent with
// start_position > 0 is InvalidBlockSequence even with no blocks, and a
// named parent must be known even with no blocks; either way nothing
// commits but the event counts toward the cadence, like every admitted
// device event (decision 2).
func TestPool_StoredHeaderIsCheckedWhateverTheBlockCount(t *testing.T) {
	withStart := func(ev *RouterEvent, pos uint32) *RouterEvent {
		ev.HasStartPosition, ev.StartPosition = true, pos
		return ev
	}
	tests := []struct {
		name string
		ev   *RouterEvent
		want error
	}{
		{"root, start > 0, no blocks", withStart(rootEv(mA), 16), ErrInvalidBlockSequence},
		{"root, start > 0, blocks", withStart(rootEv(mA, b(5, 5)), 16), ErrInvalidBlockSequence},
		{"root, start 0, no blocks", withStart(rootEv(mA), 0), nil},
		{"root, no start, no blocks", rootEv(mA), nil},
		{"unknown parent, no blocks", childEv(mA, 77), ErrParentBlockNotFound},
		{"known parent, no blocks", childEv(mA, 1), nil},
		{"known parent, start > 0, no blocks", withStart(childEv(mA, 1), 16), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newTestPool(t, 1000, 100, DefaultMaxKicks)
			require.NoError(t, p.ApplyEvent(rootEv(mA, b(1, 10))).FirstError)
			before := viewOf(p)
			out := p.ApplyEvent(tt.ev)
			if tt.want == nil {
				require.NoError(t, out.FirstError)
			} else {
				require.ErrorIs(t, out.FirstError, tt.want)
			}
			assert.Equal(t, uint64(2), p.PendingEventCount(), "every admitted device event counts toward the cadence")
			assert.Equal(t, before.words, p.Words())
			assert.Equal(t, before.counts, p.MemberCounts())
		})
	}
}

// TestPool_RebuildOrder: a rebuild reinstalls every retained block —
// resident or not — with a full insertion in ascending canonical order from
// the initial RNG state, then installs the replacements in request order,
// each member's events in order (decision 3). So a retained block that was
// omitted for capacity gets a fresh chance, and the bytes are fixed.
func TestPool_RebuildOrder(t *testing.T) {
	const n = 12 // more than the 8 slots
	p := newTestPool(t, 1, 1, DefaultMaxKicks)
	// Store in descending order: the smallest keys come last and are the
	// ones left out.
	for k := uint64(n); k >= 1; k-- {
		p.ApplyEvent(rootEv(mA, b(100+k, k)))
	}
	p.ApplyEvent(rootEv(mB, b(1, 500))) // table full: tracked, not resident
	require.Equal(t, 1, p.MemberBlocks(mB))
	_, smallestResident := p.Owners(1)
	require.False(t, smallestResident, "setup: key 1 must be a capacity omission")

	repC := RankReplacement{Member: mC, Events: []RouterEvent{*rootEv(mC, b(7, 900)), *rootEv(mC, b(8, 901))}}
	repB := RankReplacement{Member: mB, Events: []RouterEvent{*rootEv(mB, b(2, 800))}}
	_, err := p.ReplaceRanks([]RankReplacement{repC, repB})
	require.NoError(t, err)

	ref := newTestPool(t, 1, 1, DefaultMaxKicks)
	for k := uint64(1); k <= n; k++ { // retained, ascending canonical
		ref.ApplyEvent(rootEv(Member{WorkerID: 99}, b(k, k)))
	}
	for _, tokens := range []uint64{900, 901, 800} { // replacements in request order
		ref.ApplyEvent(rootEv(Member{WorkerID: 98}, b(tokens, tokens)))
	}
	assert.Equal(t, ref.Words(), p.Words())
	assert.Equal(t, ref.Stats().ResidentBlocks, p.Stats().ResidentBlocks)
	_, smallestResident = p.Owners(1)
	assert.True(t, smallestResident, "the rebuild re-offers a retained non-resident block first")
}

// firstTouchBuckets returns, for canonical keys in the given order, the
// bucket each one's fingerprint would be removed from (a before b), keeping
// first occurrences: the first-touch order of removing them.
func firstTouchBuckets(p *Pool, keys []uint64) []uint32 {
	var out []uint32
	for _, k := range keys {
		ad := p.t.addr.Address(k)
		bucket := ad.B
		if Bucket(p.t.words[ad.A]).Contains(ad.Fingerprint) {
			bucket = ad.A
		}
		if !slices.Contains(out, uint32(bucket)) {
			out = append(out, uint32(bucket))
		}
	}
	return out
}

func imageBuckets(b *Batch) []uint32 {
	var out []uint32
	for _, im := range b.Images {
		out = append(out, im.Bucket)
	}
	return out
}

// TestPool_ImageOrderWithinABatch: a drained batch lists buckets in
// first-touch order — events in order, and a clear or remove_rank releases
// the member's blocks in ascending external-hash order — while a rebuild's
// diff lists buckets in ascending index (decision 4). Consumers must not
// depend on the order: indices are unique and images absolute.
func TestPool_ImageOrderWithinABatch(t *testing.T) {
	// External hashes run opposite to the canonical (tokens) order.
	setup := func(t *testing.T) (*Pool, []uint64) {
		p := newTestPool(t, 4096, 1000, DefaultMaxKicks)
		var keysByExt []uint64 // canonical keys in ascending external-hash order
		for i := uint64(0); i < 40; i++ {
			require.NoError(t, p.ApplyEvent(rootEv(mA, b(1000-i, 0xA000+i*7919))).FirstError)
		}
		for i := uint64(39); ; i-- {
			keysByExt = append(keysByExt, 0xA000+i*7919)
			if i == 0 {
				break
			}
		}
		require.NotNil(t, p.Flush())
		return p, keysByExt
	}
	t.Run("cleared", func(t *testing.T) {
		p, keys := setup(t)
		want := firstTouchBuckets(p, keys)
		require.NoError(t, p.ApplyEvent(clearedEv(mA)).FirstError)
		assert.Equal(t, want, imageBuckets(p.Flush()))
	})
	t.Run("remove_rank", func(t *testing.T) {
		p, keys := setup(t)
		want := firstTouchBuckets(p, keys)
		batch, err := p.RemoveRank(mA)
		require.NoError(t, err)
		assert.Equal(t, want, imageBuckets(batch))
	})
	t.Run("events in order", func(t *testing.T) {
		p, keys := setup(t)
		// Remove in an order of our own over two events.
		order := []uint64{keys[5], keys[0], keys[30], keys[2]}
		want := firstTouchBuckets(p, order)
		require.NoError(t, p.ApplyEvent(removedEv(mA, 1000-(keys[5]-0xA000)/7919, 1000-(keys[0]-0xA000)/7919)).FirstError)
		require.NoError(t, p.ApplyEvent(removedEv(mA, 1000-(keys[30]-0xA000)/7919, 1000-(keys[2]-0xA000)/7919)).FirstError)
		assert.Equal(t, want, imageBuckets(p.Flush()))
	})
	t.Run("rebuild diff ascending", func(t *testing.T) {
		p, _ := setup(t)
		batch, err := p.ReplaceRanks([]RankReplacement{{Member: mA}})
		require.NoError(t, err)
		got := imageBuckets(batch)
		require.NotEmpty(t, got)
		assert.True(t, slices.IsSorted(got), "rebuild images %v not ascending", got)
	})
}

// TestPool_HasPendingPublicationMeansTouchedBuckets: pending publication is
// a non-empty dirty window — some bucket touched since the last drain, even
// if it will net-revert — not a non-zero pending event count (decision 8).
// Pending events that touched nothing carry over to the next drain's
// cadence count and arm no timer.
func TestPool_HasPendingPublicationMeansTouchedBuckets(t *testing.T) {
	p := newTestPool(t, 1000, 100, DefaultMaxKicks)
	require.NoError(t, p.ApplyEvent(removedEv(mA, 42)).FirstError) // unknown removal: touches nothing
	assert.Equal(t, uint64(1), p.PendingEventCount())
	assert.False(t, p.HasPendingPublication())

	require.NoError(t, p.ApplyEvent(rootEv(mA, b(1, 10))).FirstError)
	require.NoError(t, p.ApplyEvent(removedEv(mA, 1)).FirstError)
	assert.True(t, p.HasPendingPublication(), "a touched bucket is pending even though it net-reverts")
	assert.Nil(t, p.Flush(), "a net-reverted window drains to no batch")
	assert.False(t, p.HasPendingPublication())
	assert.Equal(t, uint64(0), p.PendingEventCount())
}

// TestPool_ExactStateLimits: MaxMembers and MaxTrackedBlocks refuse a
// Stored event whole, before anything commits, with a typed error that
// matches ErrAllocationFailed (PrecommitAllocationFailure, a Resource
// fault), and count it (SPEC §4.6).
func TestPool_ExactStateLimits(t *testing.T) {
	type step struct {
		ev   *RouterEvent
		want error // nil: applies
	}
	mD := Member{WorkerID: 4}
	tests := []struct {
		name                   string
		maxMembers             int
		maxTracked             uint64
		steps                  []step
		memberRej, trackedRej  uint64
		wantMembers, wantTrack int
	}{
		{"members", 2, 0, []step{
			{rootEv(mA, b(1, 1)), nil},
			{rootEv(mB, b(2, 2)), nil},
			{rootEv(mC, b(3, 3)), ErrMemberLimit},
			{rootEv(mA, b(4, 4)), nil}, // a member already holding blocks is not new
			{removedEv(mC, 3), nil},    // removals and clears need no room
			{clearedEv(mD), nil},       //
			{rootEv(mC), nil},          // an empty Stored adds no member
			{removedEv(mB, 2), nil},    // mB holds nothing now: its place is free
			{rootEv(mC, b(3, 3)), nil}, //
			{rootEv(mD, b(5, 5), b(6, 6)), ErrMemberLimit},
		}, 2, 0, 2, 3},
		{"tracked blocks", 0, 4, []step{
			{rootEv(mA, b(1, 1), b(2, 2), b(3, 3)), nil},
			{rootEv(mB, b(9, 1), b(8, 5)), ErrTrackedBlockLimit}, // refused whole: 3+2 > 4
			{rootEv(mB, b(9, 1)), nil},                           // a shared block is tracked per holder: 4
			{rootEv(mA, b(1, 1), b(2, 2)), nil},                  // nothing new for mA
			{rootEv(mA, b(4, 4)), ErrTrackedBlockLimit},
			{removedEv(mA, 3), nil},
			{rootEv(mA, b(4, 4)), nil},
		}, 0, 2, 2, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			c.ExpectedBlocks, c.MaxMembers, c.MaxTrackedBlocks = 1000, tt.maxMembers, tt.maxTracked
			p, err := NewPool(c)
			require.NoError(t, err)
			for i, s := range tt.steps {
				before := viewOf(p)
				out := p.ApplyEvent(s.ev)
				if s.want == nil {
					require.NoError(t, out.FirstError, "step %d", i)
					continue
				}
				require.ErrorIs(t, out.FirstError, s.want, "step %d", i)
				require.ErrorIs(t, out.FirstError, ErrAllocationFailed)
				var ee *EventError
				require.ErrorAs(t, out.FirstError, &ee)
				assert.Equal(t, s.ev.Member(), ee.Member)
				assert.Equal(t, PrecommitAllocationFailure, FailurePointOf(out.FirstError))
				assert.Equal(t, before.words, p.Words(), "step %d: a refused event commits nothing", i)
				assert.Equal(t, before.counts, p.MemberCounts(), "step %d", i)
			}
			s := p.Stats()
			assert.Equal(t, tt.memberRej, s.MemberLimitRejections)
			assert.Equal(t, tt.trackedRej, s.TrackedBlockLimitRejections)
			assert.Equal(t, tt.wantMembers, s.Members)
			assert.Equal(t, uint64(tt.wantTrack), s.Contributions)
		})
	}
}

// TestPool_RebuildPastALimitAbortsUntouched: a rank replacement whose
// rebuilt state would exceed a bound fails with the limit error and leaves
// the old state as it was, like any invalid replacement.
func TestPool_RebuildPastALimitAbortsUntouched(t *testing.T) {
	c := DefaultConfig()
	c.ExpectedBlocks, c.MaxTrackedBlocks, c.MaxMembers = 1000, 3, 2
	p, err := NewPool(c)
	require.NoError(t, err)
	require.NoError(t, p.ApplyEvent(rootEv(mA, b(1, 1), b(2, 2))).FirstError)
	require.NoError(t, p.ApplyEvent(rootEv(mB, b(3, 3))).FirstError)
	before := viewOf(p)

	_, err = p.ReplaceRanks([]RankReplacement{{Member: mB, Events: []RouterEvent{*rootEv(mB, b(3, 3), b(4, 4))}}})
	require.ErrorIs(t, err, ErrTrackedBlockLimit)
	_, err = p.ReplaceRanks([]RankReplacement{{Member: mC, Events: []RouterEvent{*rootEv(mC, b(5, 5))}}})
	require.ErrorIs(t, err, ErrMemberLimit)
	assert.True(t, before.equal(viewOf(p)), "a refused rebuild changed the pool")

	// Within the bounds the same replacement shape works.
	_, err = p.ReplaceRanks([]RankReplacement{{Member: mB, Events: []RouterEvent{*rootEv(mB, b(4, 4))}}})
	require.NoError(t, err)
}

func TestConfig_WithSizedLimits(t *testing.T) {
	c := DefaultConfig()
	c.ExpectedBlocks = 1 << 20 // 524,288 buckets
	got := c.WithSizedLimits()
	assert.Equal(t, DefaultMaxMembers, got.MaxMembers)
	assert.Equal(t, uint64(524_288*4*DefaultTrackedBlocksPerSlot), got.MaxTrackedBlocks)
	require.NoError(t, got.Validate())

	c.MaxMembers, c.MaxTrackedBlocks = 7, 9
	assert.Equal(t, c, c.WithSizedLimits(), "set bounds are kept")

	assert.Equal(t, 0, DefaultConfig().MaxMembers, "the library default is unbounded")
	c = DefaultConfig()
	c.MaxMembers = -1
	require.ErrorIs(t, c.Validate(), ErrInvalidConfig)
}

// TestPool_SizedLimitsBoundAFlood replays a red-team finding at the pool: a
// filter of 8,192 slots fed far more distinct blocks than it holds (the
// relay saw 2.15 M tracked) keeps its exact state at the sized bound, and
// the excess is refused and counted instead of tracked.
func TestPool_SizedLimitsBoundAFlood(t *testing.T) {
	c := DefaultConfig()
	c.ExpectedBlocks = 6_000 // 2,048 buckets, 8,192 slots
	c = c.WithSizedLimits()
	require.Equal(t, uint64(8_192*DefaultTrackedBlocksPerSlot), c.MaxTrackedBlocks)
	p, err := NewPool(c)
	require.NoError(t, err)
	const events, perEvent = 2_000, 64 // 128,000 distinct blocks from 16 workers
	refused := 0
	for i := range events {
		m := Member{WorkerID: uint64(i % 16)}
		ev := rootEv(m)
		for j := range perEvent {
			h := uint64(i*perEvent+j) + 1
			ev.Blocks = append(ev.Blocks, b(h, h*0x9E3779B97F4A7C15))
		}
		ev.Blocks[0].TokensHash = uint64(i) + 1 // a root per event
		if out := p.ApplyEvent(ev); errors.Is(out.FirstError, ErrTrackedBlockLimit) {
			refused++
		}
	}
	s := p.Stats()
	assert.LessOrEqual(t, s.Contributions, c.MaxTrackedBlocks)
	assert.LessOrEqual(t, uint64(s.UniqueBlocks), c.MaxTrackedBlocks)
	assert.Equal(t, uint64(refused), s.TrackedBlockLimitRejections)
	assert.Equal(t, events-int(c.MaxTrackedBlocks)/perEvent, refused)
}
