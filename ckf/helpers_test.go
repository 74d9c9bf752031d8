package ckf

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// Event builders for tests. Block b{ext, tokens} is one StoredBlock.

func b(ext, tokens uint64) StoredBlock { return StoredBlock{BlockHash: ext, TokensHash: tokens} }

func rootEv(m Member, blocks ...StoredBlock) *RouterEvent {
	return &RouterEvent{WorkerID: m.WorkerID, DPRank: m.DPRank, Kind: EventStored, Blocks: blocks}
}

func childEv(m Member, parent uint64, blocks ...StoredBlock) *RouterEvent {
	ev := rootEv(m, blocks...)
	ev.HasParent, ev.ParentHash = true, parent
	return ev
}

func removedEv(m Member, hashes ...uint64) *RouterEvent {
	return &RouterEvent{WorkerID: m.WorkerID, DPRank: m.DPRank, Kind: EventRemoved, BlockHashes: hashes}
}

func clearedEv(m Member) *RouterEvent {
	return &RouterEvent{WorkerID: m.WorkerID, DPRank: m.DPRank, Kind: EventCleared}
}

func onTier(ev *RouterEvent, tier StorageTier) *RouterEvent { ev.StorageTier = tier; return ev }

// chain returns the canonical hashes of a root block sequence of locals.
func chain(locals ...uint64) []uint64 { return AppendSequenceHashes(nil, locals) }

func newTestPool(t testing.TB, expected, every uint64, kicks int) *Pool {
	t.Helper()
	c := DefaultConfig()
	c.ExpectedBlocks, c.PublishEveryNEvents, c.MaxKicks = expected, every, kicks
	p, err := NewPool(c)
	require.NoError(t, err, "NewPool(%+v) error", c)
	return p
}

// fataler is the part of testing.TB that rapid.T also implements,
// including testify's require.TestingT.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
	Errorf(format string, args ...any)
	FailNow()
}

// checkBatch fails unless a non-nil batch has the SPEC §4.4 shape: not empty,
// unique bucket indices, all < bucketCount.
func checkBatch(tb fataler, b *Batch, bucketCount uint64) {
	tb.Helper()
	if b == nil {
		return
	}
	require.NotEmpty(tb, b.Images, "batch with no images, want nil instead")
	seen := make(map[uint32]bool, len(b.Images))
	for _, im := range b.Images {
		require.Less(tb, uint64(im.Bucket), bucketCount, "image bucket %d ≥ bucket count %d", im.Bucket, bucketCount)
		require.False(tb, seen[im.Bucket], "image bucket %d appears twice in one batch", im.Bucket)
		seen[im.Bucket] = true
	}
}

// applyBatch installs a batch's absolute images into a consumer copy.
func applyBatch(words []uint64, b *Batch) {
	if b == nil {
		return
	}
	for _, im := range b.Images {
		words[im.Bucket] = im.Word
	}
}

// poolView is everything observable about a pool's exact and physical state,
// for "nothing changed" comparisons.
type poolView struct {
	words   []uint64
	counts  []MemberCount
	stats   Stats
	pending bool
}

func viewOf(p *Pool) poolView {
	return poolView{words: p.Words(), counts: p.MemberCounts(), stats: p.Stats(), pending: p.HasPendingPublication()}
}

func (v poolView) equal(o poolView) bool {
	return slices.Equal(v.words, o.words) && slices.Equal(v.counts, o.counts) && v.stats == o.stats && v.pending == o.pending
}

// keysSameA returns n distinct keys whose first candidate bucket is equal,
// searching upward from start.
func keysSameA(ad Addresser, start uint64, n int) []uint64 {
	byA := map[uint64][]uint64{}
	for k := start; ; k++ {
		a := ad.Address(k).A
		byA[a] = append(byA[a], k)
		if len(byA[a]) == n {
			return byA[a]
		}
	}
}
