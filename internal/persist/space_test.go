package persist

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestStore_BelowTheReserveStopsWritingAndRecoveryIsPartial: a data dir
// whose free space is below the reserve (here: a reserve larger than any
// disk) takes no commit. The pool's journal stops with ErrLowSpace and an
// ERROR log, the actor goes on (nothing blocks on the journal), and the next
// start reports the commands admitted meanwhile as lost instead of a
// complete recovery.
func TestStore_BelowTheReserveStopsWritingAndRecoveryIsPartial(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	st, err := OpenWith(dir, StoreOptions{ReserveBytes: 1 << 62, Logger: log})
	require.NoError(t, err)
	pl := st.Pool("dc-a", Options{MaxPending: 4, Logger: log})
	rec, err := pl.Load()
	require.NoError(t, err)
	h := newActor(t, 1<<14, pl)
	require.NoError(t, pl.Restore(ctx, h, rec))
	// Far more than MaxPending commands: none waits for the stopped journal.
	for i := range uint64(100) {
		require.NoError(t, h.AdmitEvent(ctx, 1, stored(1, 0, nil, i+1)))
	}
	require.NoError(t, h.Flush(ctx))
	require.Eventually(t, func() bool { return pl.Stats().WriteError != "" }, 5*time.Second, time.Millisecond)
	stats := pl.Stats()
	assert.Contains(t, stats.WriteError, "below the reserve")
	assert.Zero(t, stats.Durable)
	assert.EqualValues(t, 100, stats.Position)
	assert.Contains(t, logs.String(), "level=ERROR")
	require.NoError(t, h.Shutdown(ctx))
	require.ErrorIs(t, pl.Close(ctx), ErrLowSpace)
	require.ErrorIs(t, st.Close(), ErrLowSpace)

	// The database was left untouched; the next start (reserve off)
	// recovers nothing and says 100 commands were lost.
	st, err = OpenWith(dir, StoreOptions{ReserveBytes: -1})
	require.NoError(t, err)
	defer st.Close()
	pl = st.Pool("dc-a", Options{})
	rec, err = pl.Load()
	require.NoError(t, err)
	assert.EqualValues(t, 100, rec.Lost)
	require.NoError(t, pl.Close(ctx))
}
