//go:build unix

package persist

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestOpen_HeldDirectoryIsErrLocked: a data dir another process holds (this
// test binary re-run as a helper that opens the store and waits) fails with
// ErrLocked naming the directory.
func TestOpen_HeldDirectoryIsErrLocked(t *testing.T) {
	if dir := os.Getenv("CKFRELAY_PERSIST_HOLD"); dir != "" {
		st, err := Open(dir)
		if err != nil {
			os.Exit(3)
		}
		os.Stdout.WriteString("held\n")
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // until the parent closes stdin
		_ = st.Close()
		os.Exit(0)
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestOpen_HeldDirectoryIsErrLocked$")
	cmd.Env = append(os.Environ(), "CKFRELAY_PERSIST_HOLD="+dir)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer func() { _ = stdin.Close(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "held\n", line)

	_, err = Open(dir)
	require.ErrorIs(t, err, ErrLocked)
	assert.Contains(t, err.Error(), "another relay holds the data directory "+dir)
}

// TestPoolLog_JournalShorterThanItsMarkResetsTheRanks: a journal that ends
// before its high-water mark (the tail of the newest write-ahead log lost:
// simulated here by deleting the last journalled commands, as a truncated
// log would) is reported with the exact count lost, every recovered rank is
// reset degraded at its recovered epoch, and the resets are journalled so
// the next start is whole again and still empty.
func TestPoolLog_JournalShorterThanItsMarkResetsTheRanks(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := Open(dir)
	require.NoError(t, err)
	pl := st.Pool("dc-a", Options{})
	rec, err := pl.Load()
	require.NoError(t, err)
	require.Zero(t, rec.Lost)
	h := startActor(t, pl)
	require.NoError(t, pl.Restore(ctx, h, rec))
	drive(t, h, 0)
	drive(t, h, 1)
	want, err := h.ExportState(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return pl.Stats().Durable == want.JournalPosition }, 5*time.Second, time.Millisecond)
	require.NoError(t, h.Shutdown(ctx))
	require.NoError(t, pl.Close(ctx))
	// The last 5 commands are gone from the journal; the mark still says
	// they were committed.
	require.NoError(t, st.db.DeleteRange(logKey("dc-a", want.JournalPosition-4), logKey("dc-a", want.JournalPosition+1), pebble.Sync))
	require.NoError(t, st.Close())

	st, err = Open(dir)
	require.NoError(t, err)
	pl = st.Pool("dc-a", Options{})
	rec, err = pl.Load()
	require.NoError(t, err)
	require.Equal(t, uint64(5), rec.Lost)
	require.Equal(t, want.JournalPosition-5, rec.Position)
	h2 := startActor(t, pl)
	require.NoError(t, pl.Restore(ctx, h2, rec))
	s := pl.Stats()
	assert.Equal(t, uint64(5), s.LostCommands)
	assert.Positive(t, s.ResetRanks)
	got, err := h2.ExportState(ctx)
	require.NoError(t, err)
	for _, m := range got.Members {
		assert.Empty(t, m.Lineage.Blocks, "member %v still advertises blocks", m.Lineage.Member)
	}
	require.NoError(t, h2.Shutdown(ctx))
	require.NoError(t, pl.Close(ctx))
	require.NoError(t, st.Close())

	st, err = Open(dir)
	require.NoError(t, err)
	defer st.Close()
	pl = st.Pool("dc-a", Options{})
	rec, err = pl.Load()
	require.NoError(t, err)
	assert.Zero(t, rec.Lost, "the resets made the journal whole again")
	h3 := startActor(t, pl)
	require.NoError(t, pl.Restore(ctx, h3, rec))
	got, err = h3.ExportState(ctx)
	require.NoError(t, err)
	for _, m := range got.Members {
		assert.Empty(t, m.Lineage.Blocks, "member %v came back after the resets", m.Lineage.Member)
	}
	require.NoError(t, h3.Shutdown(ctx))
	require.NoError(t, pl.Close(ctx))
}

// TestOpen_CorruptTableIsErrDamaged: a data dir whose table has a flipped
// block (checksum mismatch) fails to open or to load with ErrDamaged naming
// the file, within seconds. Before, Pebble's corruption report went to the
// logger's Fatalf, which parks the reporting goroutine (a compaction Open
// had started); Open waited for that compaction forever, so `relay serve`
// never listened and, still inside Open, ignored SIGTERM.
func TestOpen_CorruptTableIsErrDamaged(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := Open(dir)
	require.NoError(t, err)
	pl := st.Pool("dc-a", Options{})
	rec, err := pl.Load()
	require.NoError(t, err)
	h := startActor(t, pl)
	require.NoError(t, pl.Restore(ctx, h, rec))
	for round := range uint64(300) {
		drive(t, h, round)
	}
	want, err := h.ExportState(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return pl.Stats().Durable == want.JournalPosition }, 10*time.Second, time.Millisecond)
	require.NoError(t, h.Shutdown(ctx))
	require.NoError(t, pl.Close(ctx))
	require.NoError(t, st.db.Flush())
	require.NoError(t, st.db.Compact(ctx, []byte{0}, []byte{0xff}, true))
	require.NoError(t, st.Close())

	tables, err := filepath.Glob(filepath.Join(dir, "*.sst"))
	require.NoError(t, err)
	require.NotEmpty(t, tables)
	for _, table := range tables {
		f, err := os.OpenFile(table, os.O_RDWR, 0)
		require.NoError(t, err)
		fi, err := f.Stat()
		require.NoError(t, err)
		_, err = f.WriteAt([]byte{0xde, 0xad, 0xbe, 0xef, 0xde, 0xad, 0xbe, 0xef}, fi.Size()*2/5)
		require.NoError(t, err)
		require.NoError(t, f.Close())
	}

	done := make(chan error, 1)
	go func() {
		st, err := Open(dir)
		if err != nil {
			done <- err
			return
		}
		_, err = st.Pool("dc-a", Options{}).Load()
		done <- err
	}()
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrDamaged)
		assert.Contains(t, err.Error(), ".sst")
	case <-time.After(30 * time.Second):
		require.FailNow(t, "opening a data dir with a corrupt table hangs")
	}
}

// TestPoolLog_MissingOrDamagedMarkIsUnverified: stored state whose
// high-water mark file was deleted or damaged loads as it is, but says the
// journal could not be checked (Unverified) instead of passing for a whole
// recovery. Before, a damaged mark claimed nothing and the load read as
// complete — with the newest write-ahead log deleted too, commands were
// gone without a word.
func TestPoolLog_MissingOrDamagedMarkIsUnverified(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := Open(dir)
	require.NoError(t, err)
	pl := st.Pool("dc-a", Options{})
	rec, err := pl.Load()
	require.NoError(t, err)
	assert.Empty(t, rec.Unverified, "a new data dir has no mark and nothing to check")
	h := startActor(t, pl)
	require.NoError(t, pl.Restore(ctx, h, rec))
	drive(t, h, 0)
	want, err := h.ExportState(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return pl.Stats().Durable == want.JournalPosition }, 5*time.Second, time.Millisecond)
	require.NoError(t, h.Shutdown(ctx))
	require.NoError(t, pl.Close(ctx))
	require.NoError(t, st.Close())

	load := func() Recovered {
		t.Helper()
		st, err := Open(dir)
		require.NoError(t, err)
		defer st.Close()
		pl := st.Pool("dc-a", Options{})
		rec, err := pl.Load()
		require.NoError(t, err)
		h := startActor(t, pl)
		require.NoError(t, pl.Restore(ctx, h, rec))
		assert.Equal(t, rec.Unverified, pl.Stats().Unverified, "the catalog's persistence reads it")
		require.NoError(t, h.Shutdown(ctx))
		require.NoError(t, pl.Close(ctx))
		return rec
	}
	rec = load()
	assert.Empty(t, rec.Unverified, "a whole mark checks out")
	assert.Zero(t, rec.Lost)

	mark := markPath(dir, "dc-a")
	require.NoError(t, os.WriteFile(mark, []byte("CKHW\x00\x00\x00\x00\x00\x00\x00\x09garb"), 0o600))
	rec = load()
	assert.Equal(t, markDamaged, rec.Unverified)
	assert.Equal(t, want.JournalPosition, rec.Position, "the state is kept")

	require.NoError(t, os.Remove(mark))
	rec = load()
	assert.Equal(t, markMissing, rec.Unverified)
}
