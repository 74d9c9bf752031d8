package main

import (
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/catalog"
	"github.com/stretchr/testify/require"
)

// catalogPersistence reads a pool's persistence entry from the catalog.
func catalogPersistence(t *testing.T, base, pool string) *catalog.Persistence {
	t.Helper()
	cat, err := catalog.Get(t.Context(), http.DefaultClient, base, "")
	require.NoError(t, err)
	p := cat.Pool(pool)
	require.NotNil(t, p, "no pool %q in the catalog", pool)
	return p.Persistence
}

// fingerprints returns the table's fingerprints, sorted: the same blocks give
// the same multiset wherever relocation put them.
func fingerprints(words []uint64) []uint16 {
	var fps []uint16
	for _, w := range words {
		for i := range 4 {
			if fp := ckf.Bucket(w).Slot(i); fp != 0 {
				fps = append(fps, fp)
			}
		}
	}
	slices.Sort(fps)
	return fps
}

// TestE2E_KillNineRecoversTheAdmittedState: a relay with a data dir, killed
// with SIGKILL after its journal reached the disk, restarts with the same
// blocks under a new incarnation and says in the catalog how old the
// recovered state is. Without a data dir (the default) it starts empty.
func TestE2E_KillNineRecoversTheAdmittedState(t *testing.T) {
	dir := t.TempDir()
	args := []string{"--data-dir", dir, "--pool", "p:dc=1,expected=65536", "--pool", "q:dc=2,expected=4096"}
	rl := startRelay(t, args...)
	postBurst(t, rl.base, "p", 600, 3)
	postBurst(t, rl.base, "q", 50, 2)
	// Reset one worker at a new epoch: recovered too, and its later events
	// at the old epoch stay stale.
	code, body := postJSON(t, rl.base+"/v1/pools/p/ranks/reset", `{"worker_id": 3, "source_epoch": 7}`)
	require.Equal(t, http.StatusOK, code, body)
	before := getCatalog(t, rl.base)
	for _, pool := range []string{"p", "q"} {
		require.Eventually(t, func() bool {
			ps := catalogPersistence(t, rl.base, pool)
			return ps != nil && ps.JournalPosition > 0 && ps.DurablePosition == ps.JournalPosition
		}, 10*time.Second, 5*time.Millisecond, "pool %s: journal never reached the disk", pool)
	}
	_, _, wordsBefore := relaySnapshot(t, rl.base, "p")
	require.False(t, catalogPersistence(t, rl.base, "p").Recovered)
	rl.kill()
	time.Sleep(20 * time.Millisecond) // a measurable age

	rl2 := startRelay(t, args...)
	after := getCatalog(t, rl2.base)
	for _, pool := range []string{"p", "q"} {
		require.NotNil(t, after[pool].Stats)
		require.Equal(t, before[pool].Stats.UniqueBlocks, after[pool].Stats.UniqueBlocks, "pool %s", pool)
		require.Equal(t, before[pool].Stats.Members, after[pool].Stats.Members, "pool %s", pool)
		require.NotEqual(t, before[pool].Identity.ProducerIncarnation, after[pool].Identity.ProducerIncarnation, "a new incarnation")
		ps := catalogPersistence(t, rl2.base, pool)
		require.True(t, ps.Recovered)
		require.NotEmpty(t, ps.StateWrittenAt)
		require.Greater(t, ps.RecoveredAgeSeconds, 0.0)
	}
	require.Positive(t, before["p"].Stats.UniqueBlocks)
	_, _, wordsAfter := relaySnapshot(t, rl2.base, "p")
	require.Equal(t, fingerprints(wordsBefore), fingerprints(wordsAfter), "the stream shows the same blocks")
	code, body = postJSON(t, rl2.base+"/v1/pools/p/ranks/reset", `{"worker_id": 3, "source_epoch": 6}`)
	require.Equal(t, http.StatusConflict, code, "the recovered epoch 7 makes 6 stale: %v", body)
	rl2.kill()

	// Without a data dir nothing is kept.
	rl3 := startRelay(t, "--pool", "p:dc=1,expected=65536")
	require.Zero(t, getCatalog(t, rl3.base)["p"].Stats.UniqueBlocks)
	require.Nil(t, catalogPersistence(t, rl3.base, "p"))
}

func postJSON(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
