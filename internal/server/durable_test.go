package server

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/source/dynamonats"
)

// TestPoolSink_DurableWaitsForTheJournal: with a data dir a pool gives its
// sources a sink whose Durable returns only once every command admitted
// before it is committed (what a Dynamo JetStream source waits for before
// acknowledging); without one, the plain handle (nothing to wait for).
func TestPoolSink_DurableWaitsForTheJournal(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig()
	cfg.DataDir = t.TempDir()
	srv, err := New(cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	p := srv.pools["dc-a"]
	ds, ok := p.sink().(dynamonats.DurableSink)
	require.True(t, ok)
	for i := range uint64(2000) {
		require.NoError(t, ds.AdmitEvents(ctx, 1, []ckf.RouterEvent{{WorkerID: i % 4, EventID: i, Kind: ckf.EventStored,
			Blocks: []ckf.StoredBlock{{BlockHash: i + 1, TokensHash: i}}}}))
	}
	require.NoError(t, ds.Durable(ctx))
	st := p.journal.Stats()
	assert.EqualValues(t, 2000, st.Position)
	assert.Equal(t, st.Position, st.Durable, "every admitted command is committed when Durable returns")

	cfg.DataDir = ""
	srv2, err := New(cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv2.Shutdown(context.Background()) })
	_, ok = srv2.pools["dc-a"].sink().(dynamonats.DurableSink)
	assert.False(t, ok)
}

// TestServer_DataDirReserve: data_dir_reserve_bytes reaches the store: a
// reserve larger than the disk stops the journal at the first commit, the
// pool goes on (admission is answered) and says why, in a log line that
// names the pool once (a JSON object with a key twice is ambiguous to log
// pipelines).
func TestServer_DataDirReserve(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig()
	cfg.DataDir = t.TempDir()
	cfg.DataDirReserveBytes = 1 << 62
	var logs lockedBuffer
	srv, err := New(cfg, slog.New(slog.NewJSONHandler(&logs, nil)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	p := srv.pools["dc-a"]
	for i := range uint64(10) {
		require.NoError(t, srv.AdmitForTest(ctx, "dc-a", ckf.RouterEvent{WorkerID: 1, EventID: i, Kind: ckf.EventStored,
			Blocks: []ckf.StoredBlock{{BlockHash: i + 1, TokensHash: i}}}))
	}
	require.NoError(t, srv.FlushForTest(ctx, "dc-a"))
	require.Eventually(t, func() bool { return p.journal.Stats().WriteError != "" }, 5*time.Second, time.Millisecond)
	assert.Contains(t, p.journal.Stats().WriteError, "below the reserve")
	assert.Zero(t, p.journal.Stats().Durable)
	var stopped string
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, "persist: journal stopped") && strings.Contains(line, `"dc-a"`) {
			stopped = line
		}
	}
	require.NotEmpty(t, stopped, "no journal-stopped line of dc-a in:\n%s", logs.String())
	assert.Equal(t, 1, strings.Count(stopped, `"pool":`), "the pool named once: %s", stopped)
	assert.Contains(t, stopped, `"pool":"dc-a"`)
}
