package zmq

import (
	"encoding/hex"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/sim/engine"
)

// TestSource_FailingWhenNothingIsUseful: a source whose batches are all
// dropped, then all rejected, reads failing with the reason and an excerpt
// of the payload; one useful batch ends it.
func TestSource_FailingWhenNothingIsUseful(t *testing.T) {
	pub, _ := endpoint(t, 1)
	e := startEngine(t, engine.Config{Endpoint: pub})
	hs := newHarness(t, Config{Endpoint: pub, Worker: 1, BlockSize: 16, Ingest: IngestOptions{FailWindow: 100 * time.Millisecond}})
	hs.publishUntilSeen(e, 0)
	require.NotEqual(t, StateFailing, hs.src.Status().State)

	// Every event of another block size: all dropped.
	useless := mp(t, map[string]any{"ts": 1.0, "events": []any{
		map[string]any{"type": "BlockStored", "block_hashes": []any{1}, "token_ids": make([]int, 8), "block_size": 8}}})
	require.Eventually(t, func() bool {
		require.NoError(t, e.PublishEncoded(useless))
		return hs.src.Status().State == StateFailing
	}, 10*time.Second, 5*time.Millisecond)
	st := hs.src.Status()
	assert.Equal(t, string(DropBlockSize), st.LastDropReason)
	assert.Equal(t, hex.EncodeToString(useless[:excerptBytes]), st.LastBadPayload)
	assert.Positive(t, st.DroppedByReason[string(DropBlockSize)])
	assert.Zero(t, st.Events)

	// Every batch rejected: still failing, by the rejection's reason.
	garbage := mp(t, []any{"not a timestamp", []any{}})
	require.Eventually(t, func() bool {
		require.NoError(t, e.PublishEncoded(garbage))
		st := hs.src.Status()
		return st.State == StateFailing && st.LastDropReason == string(ReasonBatch)
	}, 10*time.Second, 5*time.Millisecond)
	assert.Positive(t, hs.src.Status().RejectedByReason[string(ReasonBatch)])

	// One useful batch ends the run.
	_, err := e.Store(0, 1)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		st := hs.src.Status()
		return st.Events > 0 && st.State != StateFailing
	}, 10*time.Second, 5*time.Millisecond)
}

func TestHealth_FailingWindow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const w = 10 * time.Second
	cases := []struct {
		name              string
		firstBad, lastBad time.Duration // after t0; -1: no run
		now               time.Duration
		want              bool
	}{
		{"no useless batch", -1, -1, 20 * time.Second, false},
		{"a run shorter than the window", 0, 5 * time.Second, 9 * time.Second, false},
		{"a run as long as the window, still going", 0, 9 * time.Second, 10 * time.Second, true},
		{"a long run, last bad batch just now", 0, 30 * time.Second, 30 * time.Second, true},
		{"one bad batch, then only heartbeats past the window", 0, 0, 10 * time.Second, false},
		{"a run that stopped a window ago", 0, 20 * time.Second, 30 * time.Second, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var h health
			if tc.firstBad >= 0 {
				h.firstBad, h.lastBad = t0.Add(tc.firstBad), t0.Add(tc.lastBad)
			}
			assert.Equal(t, tc.want, h.failing(t0.Add(tc.now), w))
		})
	}
}
