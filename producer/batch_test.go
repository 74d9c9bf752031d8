package producer

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// recordingJournal records every journalled command as a string, in order.
type recordingJournal struct {
	mu      sync.Mutex
	entries []string
}

func (j *recordingJournal) add(s string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.entries = append(j.entries, s)
}

func (j *recordingJournal) Admitted(epoch uint64, ev *ckf.RouterEvent) {
	j.add(fmt.Sprintf("admitted %d %+v", epoch, *ev))
}

func (j *recordingJournal) Replaced(reps []RankReplacement) { j.add(fmt.Sprintf("replaced %+v", reps)) }

func (j *recordingJournal) Reset(epoch uint64, m ckf.Member, degraded bool) {
	j.add(fmt.Sprintf("reset %d %+v %v", epoch, m, degraded))
}

func (j *recordingJournal) Position() uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return uint64(len(j.entries))
}

// batchRun is one actor under test and everything it emitted.
type batchRun struct {
	h       Handle
	journal *recordingJournal
	faults  []string
	deltas  []ckf.Delta
	done    sync.WaitGroup
}

func startBatchRun(t *rapid.T, pc ckf.Config, maxIdle int) *batchRun {
	pool, err := ckf.NewPool(pc)
	require.NoError(t, err)
	r := &batchRun{journal: &recordingJournal{}}
	cfg := DefaultConfig()
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.Journal = r.journal
	cfg.MaxIdleSourceEpochs = maxIdle
	cfg.SubscriberBuffer = 1 << 16
	// No timed publication: the tails are published by the cadence and at
	// shutdown only, so both actors cut the same deltas.
	cfg.PublicationDelay = time.Hour
	h, faults, err := Start(pool, testScope(), cfg)
	require.NoError(t, err)
	r.h = h
	sub, err := h.Subscribe(context.Background(), testLease(1))
	require.NoError(t, err)
	r.done.Add(2)
	go func() {
		defer r.done.Done()
		for f := range faults {
			r.faults = append(r.faults, fmt.Sprintf("%+v %v", f.Member, f.Err))
		}
	}()
	go func() {
		defer r.done.Done()
		for d := range sub.Deltas() {
			r.deltas = append(r.deltas, d)
		}
	}()
	return r
}

// TestActor_BatchApplyMatchesOneByOne: the same random admissions — engine
// batches with stale and unannounced source epochs, events the pool refuses,
// resets that move epochs, idle-epoch bounds small enough to prune — into an
// actor whose pool applies one event at a time and into one whose pool has
// two apply workers (so its batches go through ApplyEvents' stages) leave
// the same journal, in the same order, the same faults, the same published
// deltas, exported state and statistics.
func TestActor_BatchApplyMatchesOneByOne(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		pc := ckf.DefaultConfig()
		pc.ExpectedBlocks = rapid.SampledFrom([]uint64{64, 1000, 5000}).Draw(t, "expected")
		pc.PublishEveryNEvents = rapid.Uint64Range(1, 16).Draw(t, "every")
		maxIdle := rapid.SampledFrom([]int{1, 3, 1 << 16}).Draw(t, "maxIdle")
		seq := startBatchRun(t, pc, maxIdle)
		pc.ApplyWorkers = 2
		par := startBatchRun(t, pc, maxIdle)
		ctx := context.Background()
		members := []ckf.Member{{WorkerID: 1}, {WorkerID: 2}, {WorkerID: 3, DPRank: 1}, {WorkerID: 4}}
		for s := range rapid.IntRange(1, 12).Draw(t, "commands") {
			if rapid.IntRange(0, 4).Draw(t, "reset") == 0 {
				m := rapid.SampledFrom(members).Draw(t, "resetMember")
				e := rapid.Uint64Range(0, 3).Draw(t, "resetEpoch")
				require.Equal(t, seq.h.ResetRank(ctx, e, m, false), par.h.ResetRank(ctx, e, m, false), "command %d: reset", s)
				continue
			}
			epoch := rapid.Uint64Range(0, 3).Draw(t, "epoch")
			evs := make([]ckf.RouterEvent, rapid.IntRange(1, 64).Draw(t, "events"))
			for i := range evs {
				m := rapid.SampledFrom(members).Draw(t, "member")
				switch rapid.IntRange(0, 5).Draw(t, "kind") {
				case 0:
					evs[i] = removed(m, uint64(i), rapid.Uint64Range(0, 300).Draw(t, "rm"), rapid.Uint64Range(0, 300).Draw(t, "rm"))
				case 1:
					evs[i] = ckf.RouterEvent{WorkerID: m.WorkerID, DPRank: m.DPRank, Kind: ckf.EventCleared}
				default:
					var hs []uint64
					for range rapid.IntRange(1, 12).Draw(t, "blocks") {
						hs = append(hs, rapid.Uint64Range(0, 300).Draw(t, "h"))
					}
					evs[i] = stored(m, uint64(i), hs...)
				}
			}
			require.NoError(t, seq.h.AdmitEvents(ctx, epoch, evs), "command %d", s)
			require.NoError(t, par.h.AdmitEvents(ctx, epoch, cloneEvents(evs)), "command %d", s)
		}
		ws, err := seq.h.ExportState(ctx)
		require.NoError(t, err)
		gs, err := par.h.ExportState(ctx)
		require.NoError(t, err)
		require.Equal(t, sortedState(ws), sortedState(gs), "exported state")
		wst, err := seq.h.Stats(ctx)
		require.NoError(t, err)
		gst, err := par.h.Stats(ctx)
		require.NoError(t, err)
		wst.Pool.ExactStateBytes, gst.Pool.ExactStateBytes = 0, 0 // per-shard maps
		require.Equal(t, wst, gst, "stats")
		for _, r := range []*batchRun{seq, par} {
			require.NoError(t, r.h.Shutdown(ctx))
			r.done.Wait()
		}
		require.Equal(t, seq.journal.entries, par.journal.entries, "journal")
		require.Equal(t, seq.faults, par.faults, "faults")
		require.Equal(t, seq.deltas, par.deltas, "deltas")
	})
}

// sortedState is s with each member's blocks in external-hash order (the
// export leaves them in map order).
func sortedState(s ExactState) ExactState {
	for _, m := range s.Members {
		slices.SortFunc(m.Lineage.Blocks, func(a, b ckf.LineageEntry) int { return cmp.Compare(a.External, b.External) })
	}
	return s
}

func cloneEvents(evs []ckf.RouterEvent) []ckf.RouterEvent {
	out := make([]ckf.RouterEvent, len(evs))
	copy(out, evs)
	return out
}

// TestActor_BatchFencedAtAFaultJournalsAsOneByOne: in the batch path, a
// fence that interrupts the delivery of a fault stops the actor there, as
// one by one: the journal holds the events before the fault and none after,
// though the pool had applied the whole batch.
func TestActor_BatchFencedAtAFaultJournalsAsOneByOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pc := ckf.DefaultConfig()
		pc.ExpectedBlocks = 4096
		pc.ApplyWorkers = 2
		pool, err := ckf.NewPool(pc)
		require.NoError(t, err)
		j := &recordingJournal{}
		cfg := DefaultConfig()
		cfg.Logger = slog.New(slog.DiscardHandler)
		cfg.Journal = j
		cfg.FaultCapacity = 1
		h, faults, err := Start(pool, testScope(), cfg)
		require.NoError(t, err)
		ctx := context.Background()
		old := ckf.Member{WorkerID: 7}
		require.NoError(t, h.AdmitEvent(ctx, 0, stored(old, 0, 1000)), "member 7 at epoch 0")
		require.NoError(t, h.Flush(ctx))
		journalled := len(j.entries)

		// One command at epoch 1: a new member's 300 blocks (applied), two
		// events of member 7, whose epoch is 0 (unannounced: faults), then a
		// second new member's store.
		var first []uint64
		for i := range uint64(300) {
			first = append(first, 2000+i)
		}
		evs := []ckf.RouterEvent{
			stored(ckf.Member{WorkerID: 1}, 1, first...),
			stored(old, 2, 1001),
			stored(old, 3, 1002),
			stored(ckf.Member{WorkerID: 2}, 4, 3000),
		}
		require.NoError(t, h.AdmitEvents(ctx, 1, evs))
		synctest.Wait() // the actor is blocked delivering the second fault
		require.NoError(t, h.Fence(ctx))
		got := j.entries[journalled:]
		require.Equal(t, 1, len(got), "journal entries after the batch")
		assert.Contains(t, got[0], "WorkerID:1 ", "the first event is journalled")
		f, ok := <-faults
		require.True(t, ok)
		assert.ErrorIs(t, f.Err, ErrUnannouncedSourceEpoch)
		assert.Equal(t, uint64(2), f.EventID, "the first fault")
		_, ok = <-faults
		assert.False(t, ok, "only one fault was delivered before the fence")
	})
}
