package producer

import (
	"fmt"
	"reflect"
	"testing"
	"testing/synctest"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// Tests pinning the decisions (marked **Decision** in SPEC §7) on the actor.

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
				if tt.name == "reset" {
					// The reset's epoch was recorded: its events apply.
					require.NoError(t, h.AdmitEvent(t.Context(), 3, stored(worker1, 10, 5)))
					s, err = h.Stats(t.Context())
					require.NoError(t, err)
					assert.Contains(t, s.Members, ckf.MemberCount{Member: worker1, Blocks: 1})
					assert.Equal(t, uint64(1), s.Faults, "no unannounced-epoch fault")
				}
			})
		})
	}
}

// TestActor_IdleSourceEpochRecordsAreBounded: records of members that hold
// nothing are kept up to MaxIdleSourceEpochs, least recently idle pruned
// first; a member holding blocks keeps its record whatever the churn.
// Before, 409,600 cleared events from distinct workers grew
// the record map without bound.
func TestActor_IdleSourceEpochRecordsAreBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const maxIdle = 4
		holder := ckf.Member{WorkerID: 1_000_000}
		h, _ := startOver(t, newTestPool(t, 1024, 1), withIdleEpochs(maxIdle))
		require.NoError(t, h.AdmitEvent(t.Context(), 5, stored(holder, 1, 42)))
		for w := uint64(1); w <= 100; w++ {
			require.NoError(t, h.AdmitEvent(t.Context(), 1, cleared(ckf.Member{WorkerID: w}, w)))
		}
		s, err := h.Stats(t.Context())
		require.NoError(t, err)
		assert.Equal(t, maxIdle+1, s.SourceEpochRecords)
		assert.Equal(t, maxIdle, s.IdleSourceEpochRecords)
		assert.Equal(t, uint64(100-maxIdle), s.SourceEpochsPruned)

		// The holder's record survived: its older incarnation is still stale.
		require.NoError(t, h.AdmitEvent(t.Context(), 4, stored(holder, 2, 43)))
		s, err = h.Stats(t.Context())
		require.NoError(t, err)
		assert.Equal(t, uint64(1), s.StaleEventsDropped)
		assert.Equal(t, []ckf.MemberCount{{Member: holder, Blocks: 1}}, s.Members)
	})
}

func withIdleEpochs(n int) Config {
	c := DefaultConfig()
	c.MaxIdleSourceEpochs = n
	return c
}

// TestActor_LateEventOfAnOlderIncarnation: a member that held nothing
// keeps its epoch while its record is among the most recently idle, so a
// late event of an older incarnation is dropped as stale; once the record
// was pruned, the member is unknown and the late event is its first event
// (trust on first use, as at pool start) — SPEC §7's decision on pruned
// epochs. A record turns idle after a reset, a replacement with no events,
// or events that leave the member with nothing.
func TestActor_LateEventOfAnOlderIncarnation(t *testing.T) {
	tests := []struct {
		name      string
		idle      func(t *testing.T, h Handle) // leaves worker1 at epoch 5 holding nothing
		churn     int                          // other members going idle afterwards
		wantStale bool
	}{
		{"reset, kept", func(t *testing.T, h Handle) { require.NoError(t, h.ResetRank(t.Context(), 5, worker1, false)) }, 1, true},
		{"empty replacement, kept", func(t *testing.T, h Handle) {
			require.NoError(t, h.ReplaceRanks(t.Context(), []RankReplacement{{SourceEpoch: 5, Member: worker1}}))
		}, 1, true},
		{"removed everything, kept", func(t *testing.T, h Handle) {
			require.NoError(t, h.ResetRank(t.Context(), 5, worker1, false))
			require.NoError(t, h.AdmitEvent(t.Context(), 5, stored(worker1, 2, 7)))
			require.NoError(t, h.AdmitEvent(t.Context(), 5, removed(worker1, 3, 7)))
		}, 1, true},
		{"reset, pruned", func(t *testing.T, h Handle) { require.NoError(t, h.ResetRank(t.Context(), 5, worker1, false)) }, 2, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h, faults := startOver(t, newTestPool(t, 1024, 1), withIdleEpochs(2))
				require.NoError(t, h.AdmitEvent(t.Context(), 4, stored(worker1, 1, 9))) // incarnation 4 holds a block
				tt.idle(t, h)
				for w := range tt.churn {
					require.NoError(t, h.AdmitEvent(t.Context(), 1, cleared(ckf.Member{WorkerID: 100 + uint64(w)}, 1)))
				}
				// A late event of incarnation 4 arrives.
				require.NoError(t, h.AdmitEvent(t.Context(), 4, stored(worker1, 4, 11)))
				s, err := h.Stats(t.Context())
				require.NoError(t, err)
				if tt.wantStale {
					assert.Equal(t, uint64(1), s.StaleEventsDropped)
					assert.Empty(t, s.Members)
				} else {
					assert.Equal(t, uint64(0), s.StaleEventsDropped)
					assert.Equal(t, []ckf.MemberCount{{Member: worker1, Blocks: 1}}, s.Members)
					assert.Equal(t, uint64(1), s.SourceEpochsPruned)
				}
				synctest.Wait()
				select {
				case f := <-faults:
					require.Fail(t, fmt.Sprintf("unexpected fault %v", f))
				default:
				}
			})
		})
	}
}

// TestActor_ExactStateLimitIsAResourceFault: a Stored event refused by a
// pool bound reaches the fault channel as a Resource fault carrying the
// typed limit error, and is counted (SPEC §4.6).
func TestActor_ExactStateLimitIsAResourceFault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pc := ckf.DefaultConfig()
		pc.ExpectedBlocks, pc.MaxMembers = 1024, 1
		pool, err := ckf.NewPool(pc)
		require.NoError(t, err)
		h, faults := startOver(t, pool, DefaultConfig())
		require.NoError(t, h.AdmitEvent(t.Context(), 0, stored(worker1, 1, 1)))
		require.NoError(t, h.AdmitEvent(t.Context(), 0, stored(ckf.Member{WorkerID: 2}, 2, 2)))
		f := recvFault(t, faults)
		assert.Equal(t, FaultResource, f.Category)
		assert.Equal(t, ckf.ReportResourceFailure, f.Disposition.Action)
		assert.ErrorIs(t, f.Err, ckf.ErrMemberLimit)
		assert.Equal(t, uint64(2), f.EventID)
		s, err := h.Stats(t.Context())
		require.NoError(t, err)
		assert.Equal(t, uint64(1), s.Pool.MemberLimitRejections)
		assert.Equal(t, 1, s.Pool.Members)
	})
}

// TestRecoveryTarget_UnexpectedRankJoinsTheInitialWave: during the initial
// recovery wave a replacement of a rank that is not expected is held with
// the wave and shares its one rebuild; it does not close the wave (SPEC §7,
// decision 10).
func TestRecoveryTarget_UnexpectedRankJoinsTheInitialWave(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{mutate: diagOn})
		target := NewRecoveryTarget(h, nil, []ckf.Member{worker1})
		stray := replaceAsync(target, 1, worker2, stored(worker2, 0, 3))
		time.Sleep(time.Second) // fake time: far past the quiet window
		synctest.Wait()
		pending(t, stray)
		require.True(t, target.InitialWaveOpen())
		require.NoError(t, target.ReplaceRank(t.Context(), 1, worker1, []ckf.RouterEvent{stored(worker1, 0, 1)}))
		require.NoError(t, <-stray)
		assert.Equal(t, uint64(1), rebuilds(t, h))
		s := mustStats(t, h)
		assert.Len(t, s.Members, 2)
	})
}

// TestActor_SubscribeSurvivesAFailedOldTail: when the old lease's tail
// cannot be published (its subscriber lagged), Subscribe still succeeds:
// the old stream ends lagged, the publisher is fenced, the barrier is taken
// again without the tail, and the new snapshot covers it (SPEC §7, the
// documented retry). The failure is counted.
func TestActor_SubscribeSurvivesAFailedOldTail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{cadence: 16, mutate: func(c *Config) {
			c.SubscriberBuffer = 1
			c.PublicationDelay = time.Hour
		}})
		old := mustSubscribe(t, h, 1)
		mustAdmit(t, h, 0, stored(worker1, 1, 1))
		mustFlush(t, h) // fills old's one-delta buffer
		mustAdmit(t, h, 0, stored(worker1, 2, 2))
		synctest.Wait() // a tail is pending; old cannot take it

		repl, err := h.Subscribe(t.Context(), testLease(2))
		require.NoError(t, err)
		d, ok := <-old.Deltas()
		require.True(t, ok)
		assert.Equal(t, uint64(1), d.Sequence)
		_, ok = <-old.Deltas()
		assert.False(t, ok)
		assert.ErrorIs(t, old.Err(), ErrLagged)

		assert.Equal(t, uint64(1), repl.Snapshot.Sequence, "the lost tail is not sequenced")
		assert.True(t, containsWords(h, repl.Snapshot.Words, 2), "the snapshot covers the tail")
		s := mustStats(t, h)
		assert.Equal(t, uint64(1), s.PublishFailures)
		assert.Equal(t, NotFenced, s.Fence)
		assert.True(t, s.HasLease)
		assert.Equal(t, testLease(2), s.Lease)
	})
}
