package producer

import (
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// streamWatchJournal records, at every journalled event, how many deltas
// wait in the subscriber's channel. The actor journals an event after
// publishing its delta, on its own goroutine, so the count is what the
// subscriber could have received at that point.
type streamWatchJournal struct {
	recordingJournal
	ch     <-chan ckf.Delta // set before the first admission
	queued []int
}

func (j *streamWatchJournal) Admitted(epoch uint64, ev *ckf.RouterEvent) {
	j.queued = append(j.queued, len(j.ch))
	j.recordingJournal.Admitted(epoch, ev)
}

// distinctStored returns n root Stored events of worker1, one new block
// each, so that at cadence 1 each publishes a delta.
func distinctStored(n int) []ckf.RouterEvent {
	evs := make([]ckf.RouterEvent, n)
	for i := range evs {
		evs[i] = stored(worker1, uint64(i+1), uint64(i+1))
	}
	return evs
}

// TestActor_DeltasOfAWakeUpAreHandedOverTogether: the deltas published by
// the Apply commands of one wake-up reach the subscriber together (when
// heldDeltas are held, and at the end of the wake-up), not one by one —
// a parked subscriber is woken once per hand-over — and all of them arrive,
// in order.
func TestActor_DeltasOfAWakeUpAreHandedOverTogether(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j := &streamWatchJournal{}
		h, _ := startActor(t, actorOpts{cadence: 1, mutate: func(c *Config) { c.Journal = j }})
		sub := mustSubscribe(t, h, 1)
		j.ch = sub.Deltas()
		held := heldDeltas(DefaultSubscriberBuffer)
		n := held + 4
		require.NoError(t, h.AdmitEvents(t.Context(), 0, distinctStored(n)))
		require.NoError(t, h.Barrier(t.Context()))

		want := make([]int, n)
		for i := held - 1; i < n; i++ {
			want[i] = held
		}
		assert.Equal(t, want, j.queued, "deltas in the channel as each event was journalled")
		for i := range n {
			d := recvDelta(t, sub)
			assert.Equal(t, sub.Snapshot.Sequence+uint64(i)+1, d.Sequence, "delta %d", i)
		}
		noDelta(t, sub)
	})
}

// TestActor_DeltasOfSingleEventCommandsAreHandedOverAtOnce: commands of one
// event (AdmitEvent) hand each delta over as it is published, even when
// the actor takes many of them in one wake-up, and a single-event command
// hands over what a batch before it held.
func TestActor_DeltasOfSingleEventCommandsAreHandedOverAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j := &streamWatchJournal{}
		h, _ := startActor(t, actorOpts{cadence: 1, mutate: func(c *Config) { c.Journal = j }})
		sub := mustSubscribe(t, h, 1)
		j.ch = sub.Deltas()
		evs := distinctStored(6)
		release := pauseActor(t, h)
		require.NoError(t, h.AdmitEvents(t.Context(), 0, evs[:2])) // held
		for _, ev := range evs[2:] {
			mustAdmit(t, h, 0, ev)
		}
		release()
		require.NoError(t, h.Barrier(t.Context()))
		assert.Equal(t, []int{0, 0, 3, 4, 5, 6}, j.queued, "deltas in the channel as each event was journalled")
		for i := range evs {
			assert.Equal(t, sub.Snapshot.Sequence+uint64(i)+1, recvDelta(t, sub).Sequence, "delta %d", i)
		}
	})
}

// TestActor_HeldDeltasCountAgainstTheSubscriberBuffer: a stream lags at the
// same count of undelivered deltas whether the actor holds them or the
// channel does: the buffer's deltas are delivered, then the stream ends
// lagged and the lease is retired stalled.
func TestActor_HeldDeltasCountAgainstTheSubscriberBuffer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const buffer = 4
		h, _ := startActor(t, actorOpts{cadence: 1, mutate: func(c *Config) { c.SubscriberBuffer = buffer }})
		sub := mustSubscribe(t, h, 1)
		require.NoError(t, h.AdmitEvents(t.Context(), 0, distinctStored(buffer+2)))
		s := mustStats(t, h)
		assert.False(t, s.HasLease, "lease after lag")
		assert.Equal(t, FenceLeaseStalled, s.Fence)
		assert.Equal(t, uint64(buffer), s.Sequence, "deltas the stream accepted")
		for i := range buffer {
			d, ok := <-sub.Deltas()
			require.True(t, ok, "delta %d missing", i)
			assert.Equal(t, uint64(i+1), d.Sequence)
		}
		_, ok := <-sub.Deltas()
		assert.False(t, ok, "lagged stream still open")
		assert.ErrorIs(t, sub.Err(), ErrLagged)
	})
}

// TestActor_HeldDeltasAreHandedOverBeforeAFaultWait: an actor blocked on a
// full fault channel in the middle of an Apply command has handed the
// subscriber every delta it published before, as it did one by one.
func TestActor_HeldDeltasAreHandedOverBeforeAFaultWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, faults := startActor(t, actorOpts{cadence: 1, mutate: func(c *Config) { c.FaultCapacity = 1 }})
		sub := mustSubscribe(t, h, 1)
		worker2 := ckf.Member{WorkerID: 2}
		mustAdmit(t, h, 0, stored(worker1, 1, 1)) // worker1 at epoch 0
		recvDelta(t, sub)
		mustAdmit(t, h, 1, stored(worker1, 2, 2)) // unannounced: fills the fault channel
		synctest.Wait()
		require.Len(t, faults, 1)
		// worker2's first event applies (a delta); worker1's faults and waits.
		require.NoError(t, h.AdmitEvents(t.Context(), 1, []ckf.RouterEvent{stored(worker2, 1, 3), stored(worker1, 3, 4)}))
		synctest.Wait() // the actor waits to deliver the second fault
		assert.Len(t, sub.Deltas(), 1, "deltas handed over before the fault wait")
		f := <-faults
		assert.Equal(t, uint64(2), f.EventID)
		f = <-faults
		assert.Equal(t, uint64(3), f.EventID)
		d := recvDelta(t, sub)
		assert.Equal(t, sub.Snapshot.Sequence+2, d.Sequence)
	})
}
