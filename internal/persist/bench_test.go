package persist

import (
	"context"
	"testing"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/producer"
	"github.com/stretchr/testify/require"
)

// benchActor starts an actor sized for 1M blocks (2^19 buckets, 50% load).
func benchActor(tb testing.TB, j producer.Journal) producer.Handle {
	return newActor(tb, 1<<20, j)
}

// fill admits blocks as 64-block chained Stored events over 64 workers.
func fill(tb testing.TB, h producer.Handle, blocks int) {
	ctx := context.Background()
	for i := 0; i < blocks; i += 64 {
		ev := ckf.RouterEvent{WorkerID: uint64(i/64) % 64, Kind: ckf.EventStored, Blocks: make([]ckf.StoredBlock, 64)}
		for j := range ev.Blocks {
			ev.Blocks[j] = ckf.StoredBlock{BlockHash: uint64(i + j + 1), TokensHash: uint64(i+j+1) * 0x9E3779B97F4A7C15}
		}
		require.NoError(tb, h.AdmitEvent(ctx, 1, ev))
	}
	require.NoError(tb, h.Flush(ctx))
}

// BenchmarkRestart measures a relay pool's restart with 1M tracked blocks:
// open the store, load, replay into a fresh actor until it has applied
// everything. from=checkpoint restores a checkpoint of 1M lineage entries
// (the state right after a checkpoint); from=journal replays 16,384
// journalled 64-block events (the worst case: CheckpointEvery commands
// since the last checkpoint is 262,144 events, but of any size).
func BenchmarkRestart(b *testing.B) {
	const blocks = 1 << 20
	for _, from := range []string{"checkpoint", "journal"} {
		b.Run("from="+from+"/blocks=1M", func(b *testing.B) {
			dir := b.TempDir()
			st, err := Open(dir)
			require.NoError(b, err)
			pl := st.Pool("p", Options{CheckpointEvery: 1 << 40})
			rec, err := pl.Load()
			require.NoError(b, err)
			h := benchActor(b, pl)
			require.NoError(b, pl.Restore(context.Background(), h, rec))
			fill(b, h, blocks)
			if from == "checkpoint" {
				state, err := h.ExportState(context.Background())
				require.NoError(b, err)
				require.NoError(b, pl.WriteCheckpoint(state))
			}
			require.NoError(b, h.Shutdown(context.Background()))
			require.NoError(b, pl.Close(context.Background()))
			require.NoError(b, st.Close())
			b.ResetTimer()
			for range b.N {
				st, err := Open(dir)
				require.NoError(b, err)
				pl := st.Pool("p", Options{CheckpointEvery: 1 << 40})
				rec, err := pl.Load()
				require.NoError(b, err)
				h := benchActor(b, pl)
				require.NoError(b, pl.Restore(context.Background(), h, rec))
				b.StopTimer()
				s, err := h.Stats(context.Background())
				require.NoError(b, err)
				require.Equal(b, blocks, s.Pool.UniqueBlocks)
				require.NoError(b, h.Shutdown(context.Background()))
				require.NoError(b, pl.Close(context.Background()))
				require.NoError(b, st.Close())
				b.StartTimer()
			}
			b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/restart")
		})
	}
}
