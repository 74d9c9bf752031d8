package producer

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// cursorJournal is a recordingJournal that records cursors too.
type cursorJournal struct{ recordingJournal }

func (j *cursorJournal) Cursor(c Cursor) { j.add(fmt.Sprintf("cursor %s %d", c.Source, c.Seq)) }

// TestAdmitEventsAt_JournalsTheCursorAfterTheEvents: the cursor follows its
// admission's events in the journal, also when they were stale (dropped) or
// there were none.
func TestAdmitEventsAt_JournalsTheCursorAfterTheEvents(t *testing.T) {
	j := &cursorJournal{}
	cfg := DefaultConfig()
	cfg.Journal = j
	h, faults, err := Start(newTestPool(t, 64, 1), testScope(), cfg)
	require.NoError(t, err)
	go func() {
		for range faults {
		}
	}()
	t.Cleanup(func() { _ = h.Shutdown(t.Context()) })
	ctx := t.Context()
	require.NoError(t, h.AdmitEventsAt(ctx, 2, []ckf.RouterEvent{stored(worker1, 1, 10), stored(worker1, 2, 11)}, Cursor{Source: "e0", Seq: 7}))
	require.NoError(t, h.AdmitEventsAt(ctx, 1, []ckf.RouterEvent{stored(worker1, 3, 12)}, Cursor{Source: "e0", Seq: 8})) // stale
	require.NoError(t, h.AdmitEventsAt(ctx, 2, nil, Cursor{Source: "e0", Seq: 9}))
	require.NoError(t, h.AdmitEvents(ctx, 2, []ckf.RouterEvent{stored(worker1, 4, 13)}))
	_, err = h.ExportState(ctx) // a barrier
	require.NoError(t, err)
	j.mu.Lock()
	defer j.mu.Unlock()
	require.Len(t, j.entries, 6)
	require.Equal(t, []string{"cursor e0 7", "cursor e0 8", "cursor e0 9"}, []string{j.entries[2], j.entries[3], j.entries[4]})
	require.Contains(t, j.entries[5], "admitted 2")
}

// TestBarrier_FollowsEveryEarlierAdmission: once Barrier returns, every
// command admitted before it is journalled (what replication and
// durability waits build on), and nothing was published for it.
func TestBarrier_FollowsEveryEarlierAdmission(t *testing.T) {
	j := &recordingJournal{}
	cfg := DefaultConfig()
	cfg.Journal = j
	cfg.PublicationDelay = time.Hour
	h, faults, err := Start(newTestPool(t, 64, 1), testScope(), cfg)
	require.NoError(t, err)
	go func() {
		for range faults {
		}
	}()
	t.Cleanup(func() { _ = h.Shutdown(t.Context()) })
	ctx := t.Context()
	before, err := h.Stats(ctx)
	require.NoError(t, err)
	for i := range uint64(50) {
		require.NoError(t, h.AdmitEvent(ctx, 1, stored(worker1, i, 100+i)))
	}
	require.NoError(t, h.Barrier(ctx))
	j.mu.Lock()
	n := len(j.entries)
	j.mu.Unlock()
	require.Equal(t, 50, n, "every admission before the barrier is journalled")
	after, err := h.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, before.Sequence, after.Sequence, "a barrier publishes nothing")
}
