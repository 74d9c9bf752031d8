package producer

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
)

func TestCheckEvents_RefusesWhatThePoolWouldDrop(t *testing.T) {
	h, _ := startActor(t, actorOpts{})
	worker2 := ckf.Member{WorkerID: 2}
	good := stored(worker1, 1, 10, 11)
	dup := stored(worker1, 2, 20, 21, 20)
	root := stored(worker1, 3, 30)
	root.HasStartPosition, root.StartPosition = true, 16
	chained := root
	chained.HasParent, chained.ParentHash = true, 10 // a start position with a parent is fine
	hostDup := dup
	hostDup.StorageTier = ckf.TierHostPinned // the pool ignores non-device tiers
	many := stored(worker1, 4)
	for i := range 40 { // past the pool's switch to a set
		many.Blocks = append(many.Blocks, ckf.StoredBlock{BlockHash: uint64(100 + i%39), TokensHash: uint64(i)})
	}

	tests := []struct {
		name  string
		evs   []ckf.RouterEvent
		index int // -1: accepted
	}{
		{"valid", []ckf.RouterEvent{good, chained, hostDup, removed(worker1, 5, 1, 1)}, -1},
		{"duplicate hash", []ckf.RouterEvent{good, dup}, 1},
		{"duplicate hash in a long event", []ckf.RouterEvent{many}, 0},
		{"root with a start position", []ckf.RouterEvent{good, good, root}, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := h.CheckEvents(1, tc.evs)
			if tc.index < 0 {
				require.NoError(t, err)
				return
			}
			var ae *AdmissionError
			require.ErrorAs(t, err, &ae)
			assert.Equal(t, tc.index, ae.Index)
			assert.ErrorIs(t, err, ckf.ErrInvalidBlockSequence)
			// The pool agrees: applied, the event is refused.
			pool := newTestPool(t, 64, 1)
			out := pool.ApplyEvent(&tc.evs[tc.index])
			assert.ErrorIs(t, out.FirstError, ckf.ErrInvalidBlockSequence)
		})
	}

	t.Run("unannounced epoch", func(t *testing.T) {
		mustAdmit(t, h, 3, good)
		require.NoError(t, h.Flush(t.Context())) // the actor recorded epoch 3
		epoch, ok := h.SourceEpoch(worker1)
		require.True(t, ok)
		assert.Equal(t, uint64(3), epoch)

		require.NoError(t, h.CheckEvents(3, []ckf.RouterEvent{good}))
		require.NoError(t, h.CheckEvents(2, []ckf.RouterEvent{good}), "a stale epoch is dropped by the actor, not refused")
		err := h.CheckEvents(4, []ckf.RouterEvent{stored(worker2, 1, 5), good})
		var ae *AdmissionError
		require.ErrorAs(t, err, &ae)
		assert.Equal(t, 1, ae.Index)
		assert.ErrorIs(t, err, ErrUnannouncedSourceEpoch)

		require.NoError(t, h.ResetRank(t.Context(), 4, worker1, false))
		require.NoError(t, h.CheckEvents(4, []ckf.RouterEvent{good}), "the reset announced epoch 4")
	})
}
