package ckf_test

import (
	"cmp"
	"slices"
	"testing"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/stretchr/testify/require"
)

func sortedLineage(ls []ckf.MemberLineage) []ckf.MemberLineage {
	for _, l := range ls {
		slices.SortFunc(l.Blocks, func(a, b ckf.LineageEntry) int { return cmp.Compare(a.External, b.External) })
	}
	return ls
}

// A pool's exported lineage, replayed into an empty pool through
// ReplaceRanks, re-creates the same lineage, owners and residency.
func TestExportLineage_RoundTrip(t *testing.T) {
	cfg := ckf.DefaultConfig()
	cfg.ExpectedBlocks = 4096
	src, err := ckf.NewPool(cfg)
	require.NoError(t, err)
	// Two workers share a chained prefix; one also removes a block.
	for w := uint64(1); w <= 2; w++ {
		ev := ckf.RouterEvent{WorkerID: w, Kind: ckf.EventStored, Blocks: []ckf.StoredBlock{{BlockHash: 10 * w, TokensHash: 1}, {BlockHash: 10*w + 1, TokensHash: 2}}}
		require.NoError(t, src.ApplyEvent(&ev).FirstError)
		child := ckf.RouterEvent{WorkerID: w, DPRank: 3, Kind: ckf.EventStored, Blocks: []ckf.StoredBlock{{BlockHash: 100 * w, TokensHash: w}}}
		require.NoError(t, src.ApplyEvent(&child).FirstError)
	}
	rm := ckf.RouterEvent{WorkerID: 2, Kind: ckf.EventRemoved, BlockHashes: []uint64{21}}
	require.NoError(t, src.ApplyEvent(&rm).FirstError)
	exported := src.ExportLineage()
	require.Len(t, exported, 4)

	dst, err := ckf.NewPool(cfg)
	require.NoError(t, err)
	var reps []ckf.RankReplacement
	for _, l := range exported {
		reps = append(reps, ckf.RankReplacement{Member: l.Member, Events: l.Events()})
	}
	_, err = dst.ReplaceRanks(reps)
	require.NoError(t, err)
	require.Equal(t, sortedLineage(exported), sortedLineage(dst.ExportLineage()))
	a, b := src.Stats(), dst.Stats()
	require.Equal(t, a.UniqueBlocks, b.UniqueBlocks)
	require.Equal(t, a.ResidentBlocks, b.ResidentBlocks)
	require.Equal(t, a.Members, b.Members)
	for _, c := range []uint64{1, 2, ckf.ChainHash(1, 2)} {
		ao, ar := src.Owners(c)
		bo, br := dst.Owners(c)
		require.Equal(t, [2]any{ao, ar}, [2]any{bo, br}, "block %d", c)
	}
}
