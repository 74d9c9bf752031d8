package producer

import (
	"reflect"
	"testing"
	"testing/synctest"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// Tests pinning the decisions of issue 17 (SPEC §7) on the actor.

// corruptFilter zeroes every bucket word of pool behind its exact state, the
// memory corruption an indexer invariant violation detects. No input can
// cause it (the pool keeps filter and exact state in step), so the test
// reaches the unexported table the way a stray write would.
func corruptFilter(t *testing.T, pool *ckf.Pool) {
	t.Helper()
	words := reflect.ValueOf(pool).Elem().FieldByName("t").FieldByName("words")
	require.True(t, words.IsValid(), "ckf.Pool has no t.words field: update corruptFilter")
	w := reflect.NewAt(words.Type(), unsafe.Pointer(words.UnsafeAddr())).Elem().Interface().([]uint64)
	clear(w)
	require.Equal(t, make([]uint64, len(w)), pool.Words())
}

func cleared(m ckf.Member, eventID uint64) ckf.RouterEvent {
	return ckf.RouterEvent{WorkerID: m.WorkerID, DPRank: m.DPRank, EventID: eventID, Kind: ckf.EventCleared}
}

// startOver starts an actor over pool (which the actor then owns) and
// fences it when the test ends.
func startOver(t *testing.T, pool *ckf.Pool, cfg Config) (Handle, <-chan Fault) {
	t.Helper()
	h, faults, err := Start(pool, testScope(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Fence(t.Context()) })
	return h, faults
}

func recvFault(t *testing.T, faults <-chan Fault) Fault {
	t.Helper()
	select {
	case f, ok := <-faults:
		require.True(t, ok, "fault channel closed")
		return f
	case <-time.After(time.Minute):
		require.FailNow(t, "no fault within a minute")
	}
	return Fault{}
}

// TestActor_InvariantViolationReportedAlikeByResetAndCleared: a reset that
// meets an indexer invariant violation is a failed acknowledgement and the
// same ProducerInvariant fault a cleared event raises (SPEC §7, decision:
// no retry). Before the fix the reset retried, found nothing and returned
// nil without a fault.
func TestActor_InvariantViolationReportedAlikeByResetAndCleared(t *testing.T) {
	tests := []struct {
		name    string
		trigger func(t *testing.T, h Handle) error // what the caller is told
		eventID uint64
	}{
		{"reset", func(t *testing.T, h Handle) error { return h.ResetRank(t.Context(), 3, worker1, false) }, 0},
		{"cleared", func(t *testing.T, h Handle) error { return h.AdmitEvent(t.Context(), 0, cleared(worker1, 9)) }, 9},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				pool := newTestPool(t, 32, 1)
				out := pool.ApplyEvent(new(stored(worker1, 1, 1, 2, 3)))
				require.NoError(t, out.FirstError)
				corruptFilter(t, pool)
				h, faults := startOver(t, pool, DefaultConfig())
				require.NoError(t, h.AdmitEvent(t.Context(), 0, stored(ckf.Member{WorkerID: 2}, 1, 7))) // sets no epoch of worker1

				err := tt.trigger(t, h)
				if tt.name == "reset" {
					require.ErrorIs(t, err, ckf.ErrIndexerInvariantViolation, "a failed reset must not be acknowledged")
				} else {
					require.NoError(t, err) // admission is asynchronous
				}
				f := recvFault(t, faults)
				assert.Equal(t, FaultProducerInvariant, f.Category)
				assert.Equal(t, ckf.FenceAndRebuildProducer, f.Disposition.Action)
				assert.Equal(t, ckf.ProducerCore, f.Disposition.RecoveryDomain)
				assert.ErrorIs(t, f.Err, ckf.ErrIndexerInvariantViolation)
				assert.Equal(t, worker1, f.Member)
				assert.Equal(t, tt.eventID, f.EventID)

				s, err := h.Stats(t.Context())
				require.NoError(t, err)
				assert.Equal(t, uint64(1), s.Faults)
				// The clear committed either way: worker1 holds nothing.
				assert.Equal(t, []ckf.MemberCount{{Member: ckf.Member{WorkerID: 2}, Blocks: 1}}, s.Members)
			})
		})
	}
}
