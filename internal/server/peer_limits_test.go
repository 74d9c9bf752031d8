package server

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/producer"
)

// TestServer_EpochCeilingBoundsRepeatedSteps: each reset within
// max_source_epoch_jump cannot, repeated, climb a member's epoch past
// producer.MaxSourceEpoch; the step past it is an error its sender sees.
func TestServer_EpochCeilingBoundsRepeatedSteps(t *testing.T) {
	cfg := testConfig()
	cfg.MaxSourceEpochJump = 1 << 61
	s, ts := startTestServer(t, cfg)
	reset := func(epoch uint64) (int, string) {
		code, body := post(t, ts.URL+"/v1/pools/dc-a/ranks/reset", "application/json",
			fmt.Sprintf(`{"worker_id": 1, "source_epoch": %d}`, epoch))
		return code, errCode(body)
	}
	for _, e := range []uint64{1 << 61, 1 << 62} {
		code, ec := reset(e)
		require.Equal(t, http.StatusOK, code, "epoch %d: %s", e, ec)
	}
	for _, e := range []uint64{1<<62 + 1, 1<<62 + 1<<61} {
		code, ec := reset(e)
		assert.Equal(t, http.StatusBadRequest, code, "epoch %d", e)
		assert.Equal(t, CodeEpochOutOfRange, ec, "epoch %d", e)
	}
	code, body := post(t, ts.URL+"/v1/pools/dc-a/ranks/replace", "application/json",
		fmt.Sprintf(`{"ranks": [{"worker_id": 1, "source_epoch": %d, "events": []}]}`, uint64(1<<62+1)))
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Equal(t, CodeEpochOutOfRange, errCode(body))
	epoch, ok := s.pools["dc-a"].handle.SourceEpoch(ckf.Member{WorkerID: 1})
	require.True(t, ok)
	assert.Equal(t, uint64(producer.MaxSourceEpoch), epoch, "the refused steps changed nothing")

	// The producer refuses it too, for callers other than HTTP (sources).
	err := s.pools["dc-a"].handle.ResetRank(t.Context(), producer.MaxSourceEpoch+1, ckf.Member{WorkerID: 2}, false)
	assert.ErrorIs(t, err, producer.ErrEpochOutOfRange)
}
