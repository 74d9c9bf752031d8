package hub

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// Watch's channel closes at each change of the position: a delta, a new
// snapshot, the close.
func TestHub_WatchWakesOnEveryChange(t *testing.T) {
	h, err := New(DefaultConfig())
	require.NoError(t, err)
	pos, changed := h.Watch()
	assert.Equal(t, Position{}, pos)
	assert.False(t, pos.Covers(0, 0), "not installed: covers nothing")

	id := ckf.ProducerIdentity{}
	h.Install(ckf.Snapshot{Identity: id, Lease: ckf.LaneLease{AssignmentEpoch: 3}, Sequence: 7, Words: make([]uint64, 8)})
	requireClosed(t, changed, "install")
	pos, changed = h.Watch()
	assert.Equal(t, Position{Epoch: 3, Sequence: 7, Ready: true}, pos)
	assert.True(t, pos.Covers(3, 7))
	assert.False(t, pos.Covers(3, 8), "the same lease's stream must reach the sequence")
	assert.True(t, pos.Covers(2, 100), "a later lease's snapshot covers an earlier lease's publications")
	assert.False(t, pos.Covers(4, 0), "a later lease than the mirror's")

	require.NoError(t, h.Apply(ckf.Delta{Identity: id, BaseSequence: 7, Sequence: 8, Images: []ckf.BucketImage{{Bucket: 1, Word: 5}}}))
	requireClosed(t, changed, "delta")
	pos, changed = h.Watch()
	assert.True(t, pos.Covers(3, 8))

	h.Close(nil)
	requireClosed(t, changed, "close")
	pos, _ = h.Watch()
	assert.True(t, pos.Closed)
	assert.False(t, pos.Covers(0, 0), "a closed hub covers nothing")
}

func requireClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	default:
		require.FailNowf(t, "Watch's channel still open", "after the %s", what)
	}
}
