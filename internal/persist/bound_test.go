package persist

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPoolLog_BlockBoundHoldsAcrossRestarts: the blocks journalled since the
// last checkpoint count across restarts. Each of three runs journals 60% of
// CheckpointEveryBlocks — under the bound within any one run — yet a
// restart never finds more than the bound (plus the commit that crossed it)
// in its journal: a checkpoint is taken once the total passes it.
func TestPoolLog_BlockBoundHoldsAcrossRestarts(t *testing.T) {
	const bound = 1000
	dir := t.TempDir()
	opt := Options{CheckpointEveryBlocks: bound, CheckpointEvery: 1 << 30}
	ctx := context.Background()
	for run := range uint64(3) {
		st, err := Open(dir)
		require.NoError(t, err)
		pl := st.Pool("dc-a", opt)
		rec, err := pl.Load()
		require.NoError(t, err)
		var inJournal uint64
		for i := range rec.Journal {
			inJournal += rec.Journal[i].blocks()
		}
		require.LessOrEqual(t, inJournal, uint64(bound+100), "run %d: a restart replays at most the bound", run)
		h := newActor(t, 1<<14, pl)
		require.NoError(t, pl.Restore(ctx, h, rec))
		w := 100 + run // a fresh worker each run: no epoch conflicts
		for i := range uint64(6) {
			hashes := make([]uint64, 100)
			for j := range hashes {
				hashes[j] = run<<32 | i<<16 | uint64(j) + 1
			}
			require.NoError(t, h.AdmitEvent(ctx, 1, stored(w, 0, nil, hashes...)))
		}
		require.NoError(t, h.Flush(ctx))
		pos := pl.Position()
		require.Eventually(t, func() bool { return pl.Stats().Durable == pos }, 5*time.Second, time.Millisecond)
		if run >= 1 {
			require.Eventually(t, func() bool { return pl.Stats().Checkpoint > 0 }, 5*time.Second, time.Millisecond,
				"run %d: 1,200 blocks journalled across two runs passed the bound of %d", run, bound)
		}
		require.NoError(t, h.Shutdown(ctx))
		require.NoError(t, pl.Close(ctx))
		require.NoError(t, st.Close())
	}
}
