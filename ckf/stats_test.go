package ckf

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// liveHeap returns the live heap after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// fillChains stores n blocks into p as members chained 16-block Stored events
// (round robin over members), reusing one event so that only the pool's own
// state stays live.
func fillChains(t *testing.T, p *Pool, n, members int) {
	t.Helper()
	const perEvent = 16
	var blocks [perEvent]StoredBlock
	last := make([]uint64, members)
	ev := RouterEvent{Kind: EventStored, Blocks: blocks[:]}
	next := uint64(1)
	for i := 0; i*perEvent < n; i++ {
		m := i % members
		for j := range blocks {
			blocks[j] = StoredBlock{BlockHash: next, TokensHash: next * 0x9E3779B97F4A7C15}
			next++
		}
		ev.WorkerID = uint64(m)
		ev.HasParent, ev.ParentHash = last[m] != 0, last[m]
		last[m] = blocks[perEvent-1].BlockHash
		out := p.ApplyEvent(&ev)
		require.NoError(t, out.FirstError, "ApplyEvent")
	}
}

// TestPool_ExactStateBytesMatchesHeap compares Stats().ExactStateBytes with
// the live heap the exact state takes, measured by runtime.MemStats: the pool
// (filter and dirty window included) is built before the first reading, so
// the difference is the lineage, block and member maps. The sizes sit on both
// sides of a power-of-two growth step (≈ 47 and ≈ 72 bytes per block).
func TestPool_ExactStateBytesMatchesHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("fills pools of up to 200,000 blocks")
	}
	const tolerance = 0.10
	cases := []struct {
		name     string
		blocks   int
		members  int
		expected uint64
	}{
		{"50k blocks 1 member", 50_000, 1, 50_000},
		{"128Ki blocks 8 members", 1 << 17, 8, 1 << 17},
		{"200k blocks 8 members", 200_000, 8, 1 << 18},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.ExpectedBlocks = tc.expected
			cfg.PublishEveryNEvents = 16
			p, err := NewPool(cfg)
			require.NoError(t, err, "NewPool")
			before := liveHeap()
			fillChains(t, p, tc.blocks, tc.members)
			measured := float64(liveHeap()) - float64(before)
			st := p.Stats()
			runtime.KeepAlive(p)
			require.Equal(t, tc.blocks, st.UniqueBlocks, "UniqueBlocks = %d, want %d", st.UniqueBlocks, tc.blocks)
			ratio := float64(st.ExactStateBytes) / measured
			t.Logf("estimate %.2f B/block, measured %.2f B/block, ratio %.3f",
				float64(st.ExactStateBytes)/float64(tc.blocks), measured/float64(tc.blocks), ratio)
			assert.False(t, ratio < 1-tolerance || ratio > 1+tolerance, "ExactStateBytes = %d, measured heap %.0f: ratio %.3f, want within %.0f%%", st.ExactStateBytes, measured, ratio, 100*tolerance)
		})
	}
}

func TestMapBytes_Table(t *testing.T) {
	const slot = 16
	group := uint64(8 + 8*slot)
	table := func(slots uint64) uint64 {
		tables := max(slots/1024, 1)
		g := slots / 8 * group
		return mapHeaderBytes + tables*(mapTableBytes+mapDirectoryBytes) + g + g/16
	}
	cases := []struct {
		n    int
		want uint64
	}{
		{0, mapHeaderBytes},
		{1, mapHeaderBytes + group},
		{8, mapHeaderBytes + group}, // a small map: one group
		{9, table(16)},
		{14, table(16)}, // 14 = 7/8 of 16
		{15, table(32)},
		{896, table(1024)}, // one full table
		{897, table(2048)}, // split into two
		{1 << 20, table(1 << 21)},
	}
	for _, tc := range cases {
		got := mapBytes(tc.n, slot)
		assert.Equal(t, tc.want, got, "mapBytes(%d, %d) = %d, want %d", tc.n, slot, got, tc.want)
	}
}
