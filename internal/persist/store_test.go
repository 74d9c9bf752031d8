package persist

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/producer"
	"github.com/stretchr/testify/require"
)

// startActor starts a journalled actor over a small pool, shut down when
// the test ends.
func startActor(t *testing.T, j producer.Journal) producer.Handle {
	t.Helper()
	h := newActor(t, 1<<14, j)
	t.Cleanup(func() { _ = h.Shutdown(context.Background()) })
	return h
}

// newActor starts an actor over a pool sized for expectedBlocks that
// journals to j and discards its faults.
func newActor(tb testing.TB, expectedBlocks uint64, j producer.Journal) producer.Handle {
	tb.Helper()
	cfg := ckf.DefaultConfig()
	cfg.ExpectedBlocks = expectedBlocks
	pool, err := ckf.NewPool(cfg)
	require.NoError(tb, err)
	pcfg := producer.DefaultConfig()
	pcfg.Journal = j
	pcfg.Logger = slog.New(slog.DiscardHandler)
	h, faults, err := producer.Start(pool, producer.Scope{ProducerIncarnation: 1}, pcfg)
	require.NoError(tb, err)
	go func() {
		for range faults {
		}
	}()
	return h
}

func stored(w uint64, rank uint32, parent *uint64, hashes ...uint64) ckf.RouterEvent {
	ev := ckf.RouterEvent{WorkerID: w, DPRank: rank, Kind: ckf.EventStored}
	if parent != nil {
		ev.HasParent, ev.ParentHash = true, *parent
	}
	for _, h := range hashes {
		ev.Blocks = append(ev.Blocks, ckf.StoredBlock{BlockHash: h, TokensHash: h * 7})
	}
	return ev
}

// canonical sorts a state's lineages so two exports compare equal.
func canonical(st producer.ExactState) producer.ExactState {
	for _, m := range st.Members {
		slices.SortFunc(m.Lineage.Blocks, func(a, b ckf.LineageEntry) int { return cmp.Compare(a.External, b.External) })
	}
	st.JournalPosition = 0
	return st
}

// drive runs a mixed workload through h: stores (chained), removals, a
// clear, a rank reset at a new epoch and a rank replacement.
func drive(t *testing.T, h producer.Handle, round uint64) {
	t.Helper()
	ctx := context.Background()
	base := round * 1000
	wk := func(w uint64) uint64 { return round*10 + w } // fresh workers a round: no epoch conflicts
	for w := uint64(1); w <= 4; w++ {
		require.NoError(t, h.AdmitEvent(ctx, 1, stored(wk(w), 0, nil, base+10*w, base+10*w+1)))
		p := base + 10*w + 1
		require.NoError(t, h.AdmitEvent(ctx, 1, stored(wk(w), 0, &p, base+10*w+2)))
		require.NoError(t, h.AdmitEvent(ctx, 1, stored(wk(w), 1, nil, base+10*w+5)))
	}
	require.NoError(t, h.AdmitEvent(ctx, 1, ckf.RouterEvent{WorkerID: wk(2), Kind: ckf.EventRemoved, BlockHashes: []uint64{base + 22}}))
	require.NoError(t, h.AdmitEvent(ctx, 1, ckf.RouterEvent{WorkerID: wk(3), DPRank: 1, Kind: ckf.EventCleared}))
	require.NoError(t, h.ResetRank(ctx, 2, ckf.Member{WorkerID: wk(4)}, round%2 == 0))
	require.NoError(t, h.ReplaceRanks(ctx, []producer.RankReplacement{{SourceEpoch: 3, Member: ckf.Member{WorkerID: wk(9), DPRank: 2},
		Events: []ckf.RouterEvent{stored(wk(9), 2, nil, base+90, base+91)}}}))
	require.NoError(t, h.Flush(ctx))
}

// TestPoolLog_RestoreReproducesTheExactState: what the actor applied, with
// checkpoints taken along the way, comes back exactly — every member's
// lineage and source epoch — in a fresh actor after the store is reopened.
func TestPoolLog_RestoreReproducesTheExactState(t *testing.T) {
	for _, every := range []uint64{1 << 30, 7} { // journal only; checkpoints every 7 commands
		dir := t.TempDir()
		st, err := Open(dir)
		require.NoError(t, err)
		pl := st.Pool("dc-a", Options{CheckpointEvery: every})
		rec, err := pl.Load()
		require.NoError(t, err)
		require.False(t, rec.Found)
		h := startActor(t, pl)
		require.NoError(t, pl.Restore(context.Background(), h, rec))
		for round := range uint64(5) {
			drive(t, h, round)
		}
		want, err := h.ExportState(context.Background())
		require.NoError(t, err)
		require.Equal(t, uint64(5*16), want.JournalPosition, "every command that changed state is journalled")
		require.Eventually(t, func() bool {
			s := pl.Stats()
			return s.Durable == want.JournalPosition && (every > 100 || s.Checkpoint > 0)
		}, 5*time.Second, time.Millisecond)
		require.NoError(t, h.Shutdown(context.Background()))
		require.NoError(t, pl.Close(context.Background()))
		require.NoError(t, st.Close())

		st, err = Open(dir)
		require.NoError(t, err)
		pl = st.Pool("dc-a", Options{CheckpointEvery: every})
		rec, err = pl.Load()
		require.NoError(t, err)
		require.True(t, rec.Found)
		require.WithinDuration(t, time.Now(), rec.WrittenAt, time.Minute)
		if every < 100 {
			require.Positive(t, rec.Blocks, "a checkpoint was loaded")
			require.Less(t, len(rec.Journal), 80)
		} else {
			require.Len(t, rec.Journal, 80)
		}
		h2 := startActor(t, pl)
		require.NoError(t, pl.Restore(context.Background(), h2, rec))
		got, err := h2.ExportState(context.Background())
		require.NoError(t, err)
		require.Equal(t, canonical(want), canonical(got))
		require.Equal(t, want.JournalPosition, got.JournalPosition, "journalling resumes after the recovered position")
		// New commands go on from there and survive another restart.
		drive(t, h2, 9)
		require.NoError(t, h2.Shutdown(context.Background()))
		require.NoError(t, pl.Close(context.Background()))
		require.NoError(t, st.Close())
	}
}

func TestRecordCodec_RoundTrip(t *testing.T) {
	p := uint64(5)
	ev := stored(3, 2, &p, 6, 7)
	ev.HasStartPosition, ev.StartPosition, ev.EventID = true, 12, 99
	recs := []Record{
		{Kind: KindAdmitted, SourceEpoch: 4, Event: ev},
		{Kind: KindAdmitted, SourceEpoch: 1, Event: ckf.RouterEvent{WorkerID: 1, Kind: ckf.EventRemoved, BlockHashes: []uint64{1, 2}}},
		{Kind: KindAdmitted, SourceEpoch: 1, Event: ckf.RouterEvent{WorkerID: 1, Kind: ckf.EventCleared, StorageTier: ckf.TierExternal}},
		{Kind: KindReset, SourceEpoch: 1 << 60, Member: ckf.Member{WorkerID: 8, DPRank: 1<<32 - 1}, Degraded: true},
		{Kind: KindReplaced, Reps: []producer.RankReplacement{{SourceEpoch: 2, Member: ckf.Member{WorkerID: 3}, Events: []ckf.RouterEvent{stored(3, 0, nil, 1)}},
			{SourceEpoch: 3, Member: ckf.Member{WorkerID: 4}}}},
	}
	for _, r := range recs {
		b, err := appendRecord(nil, &r)
		require.NoError(t, err)
		got, err := decodeRecord(b)
		require.NoError(t, err)
		if r.Kind == KindReplaced {
			require.Len(t, got.Reps, len(r.Reps))
			for i := range r.Reps {
				require.Equal(t, r.Reps[i].Member, got.Reps[i].Member)
				require.Equal(t, r.Reps[i].SourceEpoch, got.Reps[i].SourceEpoch)
				require.Equal(t, len(r.Reps[i].Events), len(got.Reps[i].Events))
			}
			continue
		}
		require.Equal(t, r, got)
	}
}

// FuzzDecodeRecord: no stored bytes make the decoder panic, and what decodes
// encodes back to a record that decodes the same.
func FuzzDecodeRecord(f *testing.F) {
	p := uint64(5)
	for _, r := range []Record{
		{Kind: KindAdmitted, SourceEpoch: 4, Event: stored(3, 2, &p, 6, 7)},
		{Kind: KindReset, SourceEpoch: 9, Member: ckf.Member{WorkerID: 8}},
		{Kind: KindReplaced, Reps: []producer.RankReplacement{{SourceEpoch: 2, Member: ckf.Member{WorkerID: 3}, Events: []ckf.RouterEvent{stored(3, 0, nil, 1)}}}},
	} {
		b, err := appendRecord(nil, &r)
		require.NoError(f, err)
		f.Add(b)
	}
	f.Add([]byte{'p', 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRecord(b)
		if err != nil {
			require.ErrorIs(t, err, ErrCorrupt)
			return
		}
		again, err := appendRecord(nil, &r)
		require.NoError(t, err)
		r2, err := decodeRecord(again)
		require.NoError(t, err)
		require.Equal(t, len(r.Reps), len(r2.Reps))
		require.Equal(t, r.Event, r2.Event)
	})
}

// FuzzDecodeMember: a corrupt checkpoint entry is an error, never a panic.
func FuzzDecodeMember(f *testing.F) {
	f.Add(appendMember(nil, &producer.MemberState{SourceEpoch: 3, Lineage: ckf.MemberLineage{Blocks: []ckf.LineageEntry{{External: 1, Canonical: 2}}}}))
	f.Add([]byte{0x80})
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := decodeMember(ckf.Member{}, b)
		if err != nil {
			require.ErrorIs(t, err, ErrCorrupt)
			return
		}
		// Varints may be non-minimal on disk; the value round-trips.
		again, err := decodeMember(ckf.Member{}, appendMember(nil, &st))
		require.NoError(t, err)
		require.Equal(t, st, again)
	})
}
