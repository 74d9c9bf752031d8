package main

import (
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestE2E_DataDirThatStopsTakingWritesDoesNotKillTheRelay: a relay whose
// data dir stops taking writes (a full disk, reproduced with a 1 MiB
// file-size limit on the relay process: writes past it fail with EFBIG) keeps
// running and serving: the pool goes on without persistence and says so
// (persistence.write_error), and ingest is still answered. The next start
// (no limit) does not claim a complete recovery: the journal's high-water
// mark shows commands were admitted that never reached the disk.
func TestE2E_DataDirThatStopsTakingWritesDoesNotKillTheRelay(t *testing.T) {
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Skip("needs prlimit (util-linux)")
	}
	dir := t.TempDir()
	args := []string{"--listen", "127.0.0.1:0", "--data-dir", dir, "--pool", "p:dc=1,expected=262144"}
	const limit = 1 << 20
	rl := startRelayUnder(t, []string{prlimit, "--fsize=" + strconv.Itoa(limit), "--"}, args...)
	// ~60 bytes a journalled event: 40,000 events pass the limit.
	failed := false
	for range 40 {
		postBurst(t, rl.base, "p", 1000, 2)
		if ps := catalogPersistence(t, rl.base, "p"); ps.WriteError != "" {
			failed = true
			break
		}
	}
	require.True(t, failed, "the journal never hit the file-size limit")
	// Still serving: ingest is answered, the catalog reads, nothing exited.
	postBurst(t, rl.base, "p", 500, 2)
	ps := catalogPersistence(t, rl.base, "p")
	assert.NotEmpty(t, ps.WriteError)
	select {
	case <-rl.exited:
		require.Fail(t, "the relay exited", "%v", rl.err)
	default:
	}
	blocks := getCatalog(t, rl.base)["p"].Stats.UniqueBlocks
	assert.Positive(t, blocks)
	require.NoError(t, rl.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-rl.exited:
	case <-time.After(30 * time.Second):
		require.Fail(t, "no exit after SIGTERM")
	}
	// The exit status says admitted work was lost: it never reached the disk.
	var exit *exec.ExitError
	require.ErrorAs(t, rl.err, &exit)
	assert.Equal(t, 1, exit.ExitCode())

	rl2 := startRelay(t, args...)
	ps = catalogPersistence(t, rl2.base, "p")
	assert.Equal(t, "partial", ps.Recovery, "recovery does not claim what never reached the disk")
	assert.Positive(t, uint64(ps.LostCommands))
	assert.Zero(t, getCatalog(t, rl2.base)["p"].Stats.UniqueBlocks, "every recovered rank was reset: nothing stale is advertised")
}
