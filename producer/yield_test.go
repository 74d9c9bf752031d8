package producer

import (
	"context"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestActor_BackloggedActorLetsTheSubscriberRun: on one thread, an actor
// whose mailbox never runs empty (a sender refilling it as fast as it
// takes it) still lets the subscriber's goroutine drain the deltas, so the
// stream does not end lagged. Without the actor's yield the sender and the
// actor handed the thread to each other at every take and the subscriber's
// buffer overflowed.
func TestActor_BackloggedActorLetsTheSubscriberRun(t *testing.T) {
	backloggedSubscriberRuns(t, 16, 200_000)
}

// TestActor_BackloggedActorLetsASubscriberOfEveryEventRun: the same with a
// delta per event: a yield every 256 commands, which kept a delta per 16
// events within the buffer, let a delta per event overflow it.
func TestActor_BackloggedActorLetsASubscriberOfEveryEventRun(t *testing.T) {
	backloggedSubscriberRuns(t, 1, 50_000)
}

// backloggedSubscriberRuns admits n ring events one by one on one thread
// at the given cadence, to an actor whose subscriber has a 64-delta buffer,
// and checks that the stream ends with the shutdown, not lagged.
func backloggedSubscriberRuns(t *testing.T, cadence uint64, n int) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	pool := newTestPool(t, 1<<16, cadence)
	cfg := DefaultConfig()
	cfg.SubscriberBuffer = 64
	h, faults, err := Start(pool, testScope(), cfg)
	require.NoError(t, err)
	go func() {
		for range faults {
		}
	}()
	sub, err := h.Subscribe(t.Context(), testLease(1))
	require.NoError(t, err)
	drained := make(chan uint64)
	go func() {
		var last uint64
		for d := range sub.Deltas() {
			last = d.Sequence
		}
		drained <- last
	}()
	ctx := context.Background()
	evs, _ := benchEvents() // every event changes the filter
	for i := range n {
		require.NoError(t, h.AdmitEvent(ctx, 0, evs[i%len(evs)]), "event %d", i)
	}
	require.NoError(t, h.Shutdown(ctx))
	last := <-drained
	require.ErrorIs(t, sub.Err(), ErrShuttingDown, "the stream ended with")
	m, ok := sub.DrainMarker()
	require.True(t, ok)
	assert.Equal(t, m.ExpectedSequence, last, "the last delta received is the stream's last")
	assert.GreaterOrEqual(t, last-sub.Snapshot.Sequence, uint64(n)/cadence, "deltas published")
}
