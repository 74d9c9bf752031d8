package zmq

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/sim/engine"
	"github.com/ckfrelay/ckfrelay/producer"
)

// logJournal keeps what a leader's actor journals, in order, as a
// replicated journal would carry it.
type logJournal struct {
	mu      sync.Mutex
	apply   []func(context.Context, producer.Handle) error // the commands, replayable
	cursors []producer.Cursor
	n       uint64
}

func (j *logJournal) add(f func(context.Context, producer.Handle) error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.apply = append(j.apply, f)
	j.n++
}

func (j *logJournal) Admitted(epoch uint64, ev *ckf.RouterEvent) {
	e := *ev
	j.add(func(ctx context.Context, h producer.Handle) error { return h.AdmitEvent(ctx, epoch, e) })
}

func (j *logJournal) Replaced(reps []producer.RankReplacement) {
	j.add(func(ctx context.Context, h producer.Handle) error { return h.ReplaceRanks(ctx, reps) })
}

func (j *logJournal) Reset(epoch uint64, m ckf.Member, degraded bool) {
	j.add(func(ctx context.Context, h producer.Handle) error { return h.ResetRank(ctx, epoch, m, degraded) })
}

func (j *logJournal) Cursor(c producer.Cursor) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.cursors = append(j.cursors, c)
}

func (j *logJournal) Position() uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.n
}

// last returns the last cursor of each source.
func (j *logJournal) last() []producer.Cursor {
	j.mu.Lock()
	defer j.mu.Unlock()
	by := map[string]uint64{}
	for _, c := range j.cursors {
		by[c.Source] = c.Seq
	}
	var out []producer.Cursor
	for s, q := range by {
		out = append(out, producer.Cursor{Source: s, Seq: q})
	}
	return out
}

func (j *logJournal) seqs() []uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []uint64
	for _, c := range j.cursors {
		out = append(out, c.Seq)
	}
	return out
}

// TestSource_ResumesAfterTheCursor is the takeover of issue #34 at the ZMQ
// source: a leader admits an engine's stream up to sequence N, journalling
// the rank's cursor with every batch; it dies; the engine goes on
// publishing; a standby whose pool replayed the leader's journal starts its
// source resumed from the journalled cursors. Its source asks the engine's
// replay socket for N+1 onwards: every sequence after N is admitted exactly
// once, in order (the cursors it journals are N+1, N+2, … with no repeat
// and no hole), no rank is reset, and the pool holds exactly the engine's
// blocks.
func TestSource_ResumesAfterTheCursor(t *testing.T) {
	pub, rep := endpoint(t, 1)
	e := startEngine(t, engine.Config{Endpoint: pub, Replay: rep})
	cfg := Config{Endpoint: pub, Replay: rep, Worker: 1}
	m := ckf.Member{WorkerID: 1}

	lj := &logJournal{}
	leader := newHarnessWith(t, cfg, lj, nil)
	leader.publishUntilSeen(e, 0)
	storeSome(t, e)
	leader.publishUntilSeen(e, 0)
	leader.stop()
	n := e.Seq()
	require.Equal(t, []producer.Cursor{{Source: "zmq/1/0", Seq: uint64(n)}}, lj.last())

	// Nobody leads: the engine goes on.
	a, err := e.Store(0, 4)
	require.NoError(t, err)
	_, err = e.Store(a[3].Hash, 3)
	require.NoError(t, err)
	require.NoError(t, e.Remove(a[1].Hash))
	require.Greater(t, e.Seq(), n+2)

	sj := &logJournal{}
	standby := newHarnessWith(t, cfg, sj, func(hs *harness) {
		lj.mu.Lock()
		cmds := slices.Clone(lj.apply)
		lj.mu.Unlock()
		for _, f := range cmds {
			require.NoError(t, f(context.Background(), hs.h))
		}
		_, err := hs.h.ExportState(context.Background()) // a barrier: the pool applied it
		require.NoError(t, err)
		hs.src.Resume(lj.last())
	})
	standby.publishUntilSeen(e, 0)
	standby.stop()

	seqs := sj.seqs()
	require.NotEmpty(t, seqs)
	want := make([]uint64, 0, len(seqs))
	for q := uint64(n + 1); q <= uint64(e.Seq()); q++ {
		want = append(want, q)
	}
	require.Equal(t, want, seqs, "the standby admitted every sequence after the cursor once, in order")
	st := standby.src.Status()
	assert.Zero(t, st.Degraded)
	assert.Zero(t, st.Resets, "a resumed rank is not reset")
	assert.Zero(t, st.Restarts)
	assert.GreaterOrEqual(t, st.Replays, uint64(1))
	requireExact(t, standby.pool, m, e.Truth())
	assert.Zero(t, standby.faults.Load())
	assert.True(t, slices.IsSorted(seqs))
}
