package producer

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// pauseActor parks the actor inside a test-only command and returns the
// function that releases it. The actor has dequeued everything before it.
func pauseActor(t *testing.T, h Handle) (release func()) {
	t.Helper()
	p := &pause{entered: make(chan struct{}), release: make(chan struct{})}
	require.NoError(t, h.a.send(t.Context(), &command{kind: cmdPause, req: &request{pause: p}}), "pause")
	<-p.entered
	return func() { close(p.release) }
}

type actorOpts struct {
	expected, cadence uint64
	maxKicks          int
	mutate            func(*Config)
}

// startActor starts an actor over a fresh pool and shuts it down (or fences
// it) when the test ends, so no goroutine outlives its bubble.
func startActor(t *testing.T, o actorOpts) (Handle, <-chan Fault) {
	t.Helper()
	pc := ckf.DefaultConfig()
	pc.ExpectedBlocks = max(o.expected, 32)
	if o.expected != 0 {
		pc.ExpectedBlocks = o.expected
	}
	pc.PublishEveryNEvents = max(o.cadence, 1)
	if o.maxKicks != 0 {
		pc.MaxKicks = o.maxKicks
	}
	pool, err := ckf.NewPool(pc)
	require.NoError(t, err)
	cfg := DefaultConfig()
	if o.mutate != nil {
		o.mutate(&cfg)
	}
	h, faults, err := Start(pool, testScope(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Fence(context.Background()) })
	return h, faults
}

func mustAdmit(t *testing.T, h Handle, epoch uint64, ev ckf.RouterEvent) {
	t.Helper()
	require.NoError(t, h.AdmitEvent(t.Context(), epoch, ev), "AdmitEvent")
}

func mustStats(t *testing.T, h Handle) ActorStats {
	t.Helper()
	s, err := h.Stats(t.Context())
	require.NoError(t, err, "Stats")
	return s
}

func mustFlush(t *testing.T, h Handle) {
	t.Helper()
	require.NoError(t, h.Flush(t.Context()), "Flush")
}

func mustSubscribe(t *testing.T, h Handle, epoch uint64) *Subscription {
	t.Helper()
	s, err := h.Subscribe(t.Context(), testLease(epoch))
	require.NoError(t, err, "Subscribe")
	return s
}

// recvDelta waits for the next delta; in a synctest bubble the one-minute
// limit is fake time, so a missing delta fails fast instead of hanging.
func recvDelta(t *testing.T, s *Subscription) ckf.Delta {
	t.Helper()
	select {
	case d, ok := <-s.Deltas():
		require.True(t, ok, "stream ended: %v", s.Err())
		return d
	case <-time.After(time.Minute):
		require.FailNow(t, "no delta within a minute")
	}
	return ckf.Delta{}
}

// noDelta fails if a delta is ready on s.
func noDelta(t *testing.T, s *Subscription) {
	t.Helper()
	select {
	case d, ok := <-s.Deltas():
		require.FailNow(t, "unexpected delta", "%+v (open %v)", d, ok)
	default:
	}
}

func noFault(t *testing.T, faults <-chan Fault) {
	t.Helper()
	select {
	case f := <-faults:
		require.FailNow(t, "unexpected fault", "%v", f)
	default:
	}
}

func TestActor_AdmissionCompletesBeforePausedActorApplies(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{mutate: func(c *Config) { c.MailboxCapacity = 4 }})
		release := pauseActor(t, h)
		mustAdmit(t, h, 0, stored(worker1, 1, 1)) // the actor is parked: this cannot wait for mutation
		assert.Equal(t, 1, h.MailboxDepth())
		release()
		mustFlush(t, h)
		assert.Equal(t, 1, mustStats(t, h).Pool.UniqueBlocks)
	})
}

func TestActor_BoundedMailboxBackPressuresWithoutDropping(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{mutate: func(c *Config) { c.MailboxCapacity = 1 }})
		release := pauseActor(t, h)
		mustAdmit(t, h, 0, stored(worker1, 1, 1))
		second := make(chan error, 1)
		go func() { second <- h.AdmitEvent(context.Background(), 0, stored(worker1, 2, 2)) }()
		synctest.Wait()
		select {
		case err := <-second:
			require.FailNow(t, "second admission returned while the mailbox was full", "%v", err)
		default:
		}
		release()
		require.NoError(t, <-second, "second admission")
		mustFlush(t, h)
		assert.Equal(t, 2, mustStats(t, h).Pool.UniqueBlocks)
	})
}

// TestActor_WakeUpTakesTheWholeMailbox: the actor takes every queued
// command at one wake-up (one swap, not one receive per command), and the
// senders blocked on the full mailbox wake at that take, together, while
// the commands taken have not run yet (not once per command the actor
// runs); nothing is lost.
func TestActor_WakeUpTakesTheWholeMailbox(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{mutate: func(c *Config) { c.MailboxCapacity = 4; c.Diagnostics = true }})
		release := pauseActor(t, h)
		// The mailbox: a second pause, then three events: full.
		second := &pause{entered: make(chan struct{}), release: make(chan struct{})}
		require.NoError(t, h.a.send(t.Context(), &command{kind: cmdPause, req: &request{pause: second}}))
		for i := range uint64(3) {
			mustAdmit(t, h, 0, stored(worker1, i+1, i+1))
		}
		assert.Equal(t, 4, h.MailboxDepth())
		blocked := make(chan error, 2)
		for _, b := range []uint64{9, 10} {
			go func() { blocked <- h.AdmitEvent(context.Background(), 0, stored(worker1, b, b)) }()
		}
		synctest.Wait()
		select {
		case err := <-blocked:
			require.FailNow(t, "a sender admitted into a full mailbox", "err %v", err)
		default:
		}
		before, ok := h.Diagnostics()
		require.True(t, ok)
		release()
		<-second.entered // the actor took the pause and the three events behind it
		synctest.Wait()
		for range 2 {
			select {
			case err := <-blocked:
				require.NoError(t, err, "a blocked admission")
			default:
				require.FailNow(t, "a blocked sender still waits after the actor took the whole mailbox")
			}
		}
		after, _ := h.Diagnostics()
		assert.Equal(t, uint64(1), after.MailboxTakes-before.MailboxTakes, "wake-ups that took commands")
		assert.Equal(t, uint64(4), after.MailboxTaken-before.MailboxTaken, "commands they took")
		assert.Equal(t, 3+2, h.MailboxDepth(), "three taken and not run, two queued")
		close(second.release)
		mustFlush(t, h)
		assert.Equal(t, 5, mustStats(t, h).Pool.UniqueBlocks)
	})
}

// TestActor_AdmitEventAllocatesNothingPerEvent: admitting one event and
// applying it allocates nothing beyond what the pool's own apply of the
// same events does — no slice around the event, no mailbox wake-up
// channel, no epoch-record list element when a member empties and refills
// — so the actor adds no garbage per command to the apply's.
func TestActor_AdmitEventAllocatesNothingPerEvent(t *testing.T) {
	const perRun = 64
	var evs []ckf.RouterEvent // built once: the run admits copies (the slices are shared, never changed)
	for i := range uint64(perRun / 2) {
		evs = append(evs, stored(worker1, 2*i, 7), removed(worker1, 2*i+1, 7))
	}
	pool := newTestPool(t, 1<<10, 1<<30)
	direct := testing.AllocsPerRun(20, func() {
		for i := range evs {
			ev := evs[i]
			pool.ApplyEvent(&ev)
		}
	})
	h, _ := startActor(t, actorOpts{expected: 1 << 10, cadence: 1 << 30})
	ctx := t.Context()
	admit := func() {
		for _, ev := range evs {
			require.NoError(t, h.AdmitEvent(ctx, 0, ev))
		}
		require.NoError(t, h.Barrier(ctx)) // everything admitted has run
	}
	admit() // the actor's buffers grow once
	actor := testing.AllocsPerRun(20, admit)
	barrier := testing.AllocsPerRun(20, func() { require.NoError(t, h.Barrier(ctx)) })
	assert.LessOrEqual(t, actor, direct+barrier,
		"allocations per %d admitted events and a barrier: actor %v, the pool alone %v, a barrier alone %v", perRun, actor, direct, barrier)
}

func TestActor_PayloadPermitsBackPressureByBlockCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{mutate: func(c *Config) { c.PayloadPermits = 4 }})
		release := pauseActor(t, h)
		mustAdmit(t, h, 0, stored(worker1, 1, 1, 2, 3)) // weight 3 of 4
		second := make(chan error, 1)
		go func() { second <- h.AdmitEvent(context.Background(), 0, stored(worker1, 2, 4, 5)) }()
		synctest.Wait()
		select {
		case err := <-second:
			require.FailNow(t, "a 2-block admission returned with 1 permit free", "%v", err)
		default:
		}
		release()
		require.NoError(t, <-second)
		// An event heavier than the whole pool is capped, not refused.
		mustAdmit(t, h, 0, stored(worker1, 3, 6, 7, 8, 9, 10, 11))
		mustFlush(t, h)
		assert.Equal(t, 11, mustStats(t, h).Pool.UniqueBlocks)
	})
}

func TestActor_SubscriberGetsSnapshotThenOneAtomicReplacementDelta(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{})
		mustAdmit(t, h, 0, stored(worker1, 1, 1, 2))
		mustFlush(t, h)
		sub := mustSubscribe(t, h, 1)
		base := sub.Snapshot.Sequence
		err := h.ReplaceRanks(t.Context(), []RankReplacement{{SourceEpoch: 0, Member: worker1,
			Events: []ckf.RouterEvent{stored(worker1, 0, 3, 4)}}})
		require.NoError(t, err, "ReplaceRanks")
		d := recvDelta(t, sub)
		assert.Equal(t, base, d.BaseSequence)
		assert.Equal(t, base+1, d.Sequence)
		mustFlush(t, h)
		noDelta(t, sub)
		// The one delta takes the snapshot to the rebuilt table.
		words := applyDeltas(t, sub.Snapshot.Words, d)
		assert.Equal(t, words, mustSubscribe(t, h, 2).Snapshot.Words, "snapshot + delta differs from the rebuilt table")
	})
}

func applyDeltas(t *testing.T, words []uint64, ds ...ckf.Delta) []uint64 {
	t.Helper()
	out := append([]uint64(nil), words...)
	for _, d := range ds {
		for _, im := range d.Images {
			out[im.Bucket] = im.Word
		}
	}
	return out
}

func TestActor_ShutdownDrainsAdmittedEventsAndRejectsNewAdmission(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, faults := startActor(t, actorOpts{cadence: 16, mutate: func(c *Config) { c.MailboxCapacity = 4 }})
		sub := mustSubscribe(t, h, 1)
		release := pauseActor(t, h)
		mustAdmit(t, h, 0, stored(worker1, 1, 1))
		done := make(chan error, 1)
		go func() { done <- h.Shutdown(context.Background()) }()
		synctest.Wait()
		err := h.AdmitEvent(t.Context(), 0, stored(worker1, 2, 2))
		require.ErrorIs(t, err, ErrShuttingDown, "admission during shutdown")
		require.NotErrorIs(t, err, ErrFenced, "admission during shutdown")
		release()
		require.NoError(t, <-done, "Shutdown")
		// The admitted event was applied and its tail published before the end.
		d, ok := <-sub.Deltas()
		require.True(t, ok, "no tail before the end")
		assert.Equal(t, uint64(0), d.BaseSequence)
		assert.Equal(t, uint64(1), d.Sequence)
		_, ok = <-sub.Deltas()
		require.False(t, ok, "stream still open after shutdown")
		require.ErrorIs(t, sub.Err(), ErrShuttingDown)
		m, ok := sub.DrainMarker()
		require.True(t, ok, "no drain marker")
		assert.Equal(t, ckf.DrainMarker{Lease: testLease(1), ExpectedSequence: 1}, m)
		owners, _ := h.a.pool.Owners(1)
		assert.Equal(t, uint32(1), owners, "owners of block 1 after shutdown")
		assert.ErrorIs(t, h.AdmitEvent(t.Context(), 0, stored(worker1, 3, 3)), ErrShuttingDown, "admission after shutdown")
		assert.ErrorIs(t, h.Shutdown(t.Context()), ErrShuttingDown, "second Shutdown")
		_, ok = <-faults
		assert.False(t, ok, "fault channel open after shutdown")
	})
}

func TestActor_FenceRetiresStreamWithoutUncertainTail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{cadence: 16, mutate: func(c *Config) { c.PublicationDelay = 10 * time.Second }})
		sub := mustSubscribe(t, h, 1)
		mustAdmit(t, h, 0, stored(worker1, 1, 1))
		synctest.Wait() // the event is applied: a dirty tail is pending
		require.NoError(t, h.Fence(t.Context()), "Fence")
		d, ok := <-sub.Deltas()
		require.False(t, ok, "fence published the uncertain tail %+v", d)
		require.ErrorIs(t, sub.Err(), ErrFenced)
		err := h.AdmitEvent(t.Context(), 0, stored(worker1, 2, 2))
		assert.ErrorIs(t, err, ErrShuttingDown, "admission after fence")
		assert.ErrorIs(t, err, ErrFenced, "admission after fence")
		assert.ErrorIs(t, h.Flush(t.Context()), ErrFenced, "Flush after fence")
	})
}

func TestActor_FenceRefusesQueuedWork(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{})
		release := pauseActor(t, h)
		flushed := make(chan error, 1)
		go func() { flushed <- h.Flush(context.Background()) }()
		synctest.Wait()
		fenced := make(chan error, 1)
		go func() { fenced <- h.Fence(context.Background()) }()
		synctest.Wait()
		release()
		require.NoError(t, <-fenced)
		assert.ErrorIs(t, <-flushed, ErrFenced, "queued Flush")
	})
}

// TestActor_FenceRefusesTheRestOfATakenBatch: a fence that comes while the
// actor runs a batch it took stops it before the next command; the
// commands taken and not run are refused like queued ones (their callers
// get ErrFenced, their payload permits come back), and none of them is
// applied.
func TestActor_FenceRefusesTheRestOfATakenBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{mutate: func(c *Config) { c.PayloadPermits = 8 }})
		release := pauseActor(t, h)
		// Queued behind the first pause, so taken together: a second pause,
		// an event, a flush.
		second := &pause{entered: make(chan struct{}), release: make(chan struct{})}
		require.NoError(t, h.a.send(t.Context(), &command{kind: cmdPause, req: &request{pause: second}}))
		mustAdmit(t, h, 0, stored(worker1, 1, 1, 2, 3)) // weight 3 of 8
		flushed := make(chan error, 1)
		go func() { flushed <- h.Flush(context.Background()) }()
		synctest.Wait()
		require.Equal(t, 3, h.MailboxDepth())
		release()
		<-second.entered
		require.Equal(t, 2, h.MailboxDepth(), "the event and the flush are taken, not run")
		require.NoError(t, h.Fence(t.Context())) // interrupts the second pause
		assert.ErrorIs(t, <-flushed, ErrFenced, "the flush taken with the batch")
		assert.True(t, h.a.permits.TryAcquire(8), "the event's permits came back")
		owners, _ := h.a.pool.Owners(1)
		assert.Zero(t, owners, "the refused event was applied")
	})
}

func TestActor_FenceInterruptsFullFaultChannel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, faults := startActor(t, actorOpts{})
		mustAdmit(t, h, 0, stored(worker1, 1, 1))
		mustFlush(t, h)
		for id := uint64(2); id <= DefaultFaultCapacity+2; id++ {
			mustAdmit(t, h, 1, stored(worker1, id, id))
		}
		synctest.Wait() // the actor is blocked sending the 17th fault
		require.Len(t, faults, DefaultFaultCapacity)
		require.Equal(t, 0, h.MailboxDepth())
		require.NoError(t, h.Fence(t.Context()), "Fence") // would deadlock the bubble if not interrupted
		f := <-faults
		assert.Equal(t, FaultSourceProtocol, f.Category)
		assert.ErrorIs(t, f.Err, ErrUnannouncedSourceEpoch)
		assert.Equal(t, worker1, f.Member)
		assert.Equal(t, uint64(1), f.SourceEpoch)
		assert.Equal(t, uint64(2), f.EventID)
		assert.Equal(t, ckf.RejectSource, f.Disposition.Action)
	})
}

func TestActor_CadenceAdvancesOnDuplicateEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{cadence: 16})
		sub := mustSubscribe(t, h, 1)
		for id := uint64(1); id <= 15; id++ {
			mustAdmit(t, h, 0, stored(worker1, id, 7))
		}
		s := mustStats(t, h)
		assert.Equal(t, uint64(0), s.Sequence, "after 15")
		assert.Equal(t, uint64(15), s.Pool.PendingEvents, "after 15")
		noDelta(t, sub)
		mustAdmit(t, h, 0, stored(worker1, 16, 7))
		d := recvDelta(t, sub)
		assert.Equal(t, uint64(0), d.BaseSequence)
		assert.Equal(t, uint64(1), d.Sequence)
		s = mustStats(t, h)
		assert.Equal(t, uint64(0), s.Pool.PendingEvents, "after 16")
		assert.Equal(t, 1, s.Pool.UniqueBlocks, "after 16")
	})
}

func TestActor_TimerPublishesSparseTailWithoutFlush(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{cadence: 16})
		sub := mustSubscribe(t, h, 1)
		start := time.Now()
		mustAdmit(t, h, 0, stored(worker1, 1, 7))
		d := recvDelta(t, sub) // fake time advances only to the timer
		assert.Equal(t, DefaultPublicationDelay, time.Since(start), "published after")
		assert.Equal(t, uint64(0), d.BaseSequence)
		assert.Equal(t, uint64(1), d.Sequence)
		assert.Equal(t, uint64(1), mustStats(t, h).Sequence)
	})
}

func TestActor_ReplacementSubscriptionStartsAfterOldLeaseTail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{cadence: 16, mutate: func(c *Config) { c.PublicationDelay = 10 * time.Second }})
		old := mustSubscribe(t, h, 1)
		mustAdmit(t, h, 0, stored(worker1, 1, 7))
		repl := mustSubscribe(t, h, 2)
		tail, ok := <-old.Deltas()
		require.True(t, ok, "no old tail")
		require.Equal(t, testLease(1), tail.Lease, "the old tail goes out on lease 1")
		assert.Equal(t, tail.Sequence, repl.Snapshot.Sequence, "replacement snapshot after the old tail")
		_, ok = <-old.Deltas()
		assert.False(t, ok, "old stream still open")
		assert.ErrorIs(t, old.Err(), ErrSuperseded)
		noDelta(t, repl)
		mustAdmit(t, h, 0, stored(worker1, 2, 8))
		mustFlush(t, h)
		c := recvDelta(t, repl)
		assert.Equal(t, testLease(2), c.Lease)
		assert.Equal(t, repl.Snapshot.Sequence, c.BaseSequence)
		assert.Equal(t, repl.Snapshot.Sequence+1, c.Sequence)
	})
}

func TestActor_LaggedSubscriberIsClosedAndLeaseRetiredStalled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{mutate: func(c *Config) { c.SubscriberBuffer = 1 }})
		sub := mustSubscribe(t, h, 1)
		mustAdmit(t, h, 0, stored(worker1, 1, 1))
		mustAdmit(t, h, 0, stored(worker1, 2, 2)) // overflows the 1-delta buffer
		mustAdmit(t, h, 0, stored(worker1, 3, 3))
		s := mustStats(t, h)
		assert.False(t, s.HasLease, "lease after lag")
		assert.Equal(t, FenceLeaseStalled, s.Fence)
		assert.Equal(t, uint64(1), s.Sequence)
		d, ok := <-sub.Deltas()
		require.True(t, ok, "no buffered delta")
		assert.Equal(t, uint64(1), d.Sequence)
		_, ok = <-sub.Deltas()
		assert.False(t, ok, "lagged stream still open")
		assert.ErrorIs(t, sub.Err(), ErrLagged)
		// A new lease restarts from a snapshot that covers the skipped deltas.
		again := mustSubscribe(t, h, 2)
		assert.Equal(t, uint64(1), again.Snapshot.Sequence)
		for _, b := range []uint64{1, 2, 3} {
			assert.True(t, containsWords(h, again.Snapshot.Words, b), "resubscribe snapshot misses block %d", b)
		}
	})
}

// containsWords reports whether words answer present for canonical key k.
func containsWords(h Handle, words []uint64, k uint64) bool {
	f := h.Identity().Format
	ad := ckf.NewAddresser(f.Seed, f.BucketCount).Address(k)
	return ckf.Bucket(words[ad.A]).Contains(ad.Fingerprint) || ckf.Bucket(words[ad.B]).Contains(ad.Fingerprint)
}

func TestActor_CapacityOmissionIsObservableWithoutFault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, faults := startActor(t, actorOpts{expected: 1, maxKicks: 1})
		hashes := make([]uint64, 32)
		for i := range hashes {
			hashes[i] = uint64(i + 1)
		}
		mustAdmit(t, h, 0, stored(worker1, 1, hashes...))
		s := mustStats(t, h)
		assert.Equal(t, 32, s.Pool.UniqueBlocks)
		assert.NotZero(t, s.Pool.CapacityFailures)
		assert.Equal(t, uint64(1), s.CapacityOmissionEvents)
		noFault(t, faults)
		mustAdmit(t, h, 0, stored(worker1, 2, 1))
		mustFlush(t, h)
		synctest.Wait()
		noFault(t, faults)
		assert.Equal(t, uint64(0), mustStats(t, h).Faults, "faults sent")
	})
}

func TestActor_FailedReplacementReturnsErrorWithoutFault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, faults := startActor(t, actorOpts{})
		mustAdmit(t, h, 0, stored(worker1, 1, 1))
		foreign := ckf.Member{WorkerID: 2}
		err := h.ReplaceRanks(t.Context(), []RankReplacement{{Member: worker1,
			Events: []ckf.RouterEvent{stored(foreign, 1, 9)}}})
		require.ErrorIs(t, err, ckf.ErrInvalidReplacement)
		synctest.Wait()
		noFault(t, faults)
		s := mustStats(t, h)
		assert.Equal(t, 1, s.Pool.UniqueBlocks, "state changed by a failed replacement")
		assert.Equal(t, []ckf.MemberCount{{Member: worker1, Blocks: 1}}, s.Members, "state changed by a failed replacement")
	})
}

func TestCategoryOf_FailureDomainsStayDistinct(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		action   ckf.RecoveryAction
		recovery ckf.FailureDomain
		category FaultCategory // 0: not a fault
	}{
		{"capacity", ckf.ErrCapacityExhausted, ckf.ContinueCapacityOmission, 0, 0},
		{"allocation", ckf.ErrAllocationFailed, ckf.ReportResourceFailure, 0, FaultResource},
		{"member limit", ckf.ErrMemberLimit, ckf.ReportResourceFailure, 0, FaultResource},
		{"tracked-block limit", ckf.ErrTrackedBlockLimit, ckf.ReportResourceFailure, 0, FaultResource},
		{"ownership overflow", ckf.ErrOwnershipDegreeOverflow, ckf.RejectSource, 0, FaultSourceProtocol},
		{"parent not found", ckf.ErrParentBlockNotFound, ckf.RejectSource, 0, FaultSourceProtocol},
		{"invalid sequence", ckf.ErrInvalidBlockSequence, ckf.RejectSource, 0, FaultSourceProtocol},
		{"invariant", ckf.ErrIndexerInvariantViolation, ckf.FenceAndRebuildProducer, ckf.ProducerCore, FaultProducerInvariant},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := &ckf.EventError{Kind: tt.err, Member: worker1}
			d, ok := ckf.DispositionOf(ckf.FailurePointOf(err))
			require.True(t, ok, "no disposition")
			assert.Equal(t, tt.action, d.Action)
			assert.Equal(t, ckf.ProducerCore, d.Domain)
			assert.Equal(t, ckf.KnownUnchanged, d.Commit)
			assert.Equal(t, tt.recovery, d.RecoveryDomain)
			c, isFault := CategoryOf(d.Action)
			assert.Equal(t, tt.category != 0, isFault)
			assert.Equal(t, tt.category, c)
		})
	}
	for _, a := range []ckf.RecoveryAction{ckf.DeactivateAndSnapshot, ckf.RetrySnapshot} {
		_, ok := CategoryOf(a)
		assert.False(t, ok, "consumer-lane action %v mapped to a producer fault", a)
	}
}

func TestActor_StaleSourceEpochCannotMutateOrFaultReplacedRank(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, faults := startActor(t, actorOpts{})
		mustAdmit(t, h, 1, stored(worker1, 1, 1))
		require.NoError(t, h.ResetRank(t.Context(), 2, worker1, false), "ResetRank")
		mustAdmit(t, h, 1, stored(worker1, 2, 2))
		mustFlush(t, h)
		s := mustStats(t, h)
		assert.Equal(t, 0, s.Pool.UniqueBlocks)
		assert.Equal(t, uint64(1), s.StaleEventsDropped)
		want := &StaleSourceEpochError{Member: worker1, Current: 2, Received: 1}
		var se *StaleSourceEpochError
		require.ErrorAs(t, h.ResetRank(t.Context(), 1, worker1, false), &se, "stale ResetRank")
		assert.Equal(t, want, se)
		err := h.ReplaceRanks(t.Context(), []RankReplacement{{SourceEpoch: 1, Member: worker1,
			Events: []ckf.RouterEvent{stored(worker1, 3, 3)}}})
		require.ErrorAs(t, err, &se, "stale ReplaceRanks")
		assert.Equal(t, want, se)
		synctest.Wait()
		noFault(t, faults)
		assert.Equal(t, 0, mustStats(t, h).Pool.UniqueBlocks, "stale replacement mutated")
		// The current epoch still works.
		mustAdmit(t, h, 2, stored(worker1, 4, 4))
		mustFlush(t, h)
		assert.Equal(t, 1, mustStats(t, h).Pool.UniqueBlocks, "current-epoch event")
	})
}

func TestActor_DegradedResetIsCountedAndPublishesZeroImages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{mutate: func(c *Config) { c.Diagnostics = true }})
		sub := mustSubscribe(t, h, 1)
		mustAdmit(t, h, 0, stored(worker1, 1, 1))
		recvDelta(t, sub)
		require.NoError(t, h.ResetRank(t.Context(), 0, worker1, true))
		d := recvDelta(t, sub)
		require.NotEmpty(t, d.Images, "reset delta")
		assert.Equal(t, uint64(0), d.Images[0].Word, "reset delta: want a zero image")
		s := mustStats(t, h)
		assert.Equal(t, uint64(1), s.DegradedResets)
		assert.Equal(t, 0, s.Pool.Members)
		dg, ok := h.Diagnostics()
		require.True(t, ok)
		assert.Equal(t, uint64(1), dg.DegradedResets)
		assert.Equal(t, uint64(2), dg.Publications)
	})
}

func TestActor_DiagnosticsOffByDefault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{})
		_, ok := h.Diagnostics()
		assert.False(t, ok, "diagnostics enabled by default")
	})
}

func TestHandle_ZeroValueIsNotStarted(t *testing.T) {
	var h Handle
	ctx := t.Context()
	checks := map[string]error{
		"AdmitEvent":   h.AdmitEvent(ctx, 0, stored(worker1, 1, 1)),
		"ReplaceRanks": h.ReplaceRanks(ctx, nil),
		"ResetRank":    h.ResetRank(ctx, 0, worker1, false),
		"Flush":        h.Flush(ctx),
		"Shutdown":     h.Shutdown(ctx),
		"Fence":        h.Fence(ctx),
	}
	_, checks["Stats"] = h.Stats(ctx)
	_, checks["Subscribe"] = h.Subscribe(ctx, testLease(1))
	for name, err := range checks {
		assert.ErrorIs(t, err, ErrNotStarted, name)
	}
}

func TestConfig_Validate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		ok     bool
	}{
		{"defaults", func(*Config) {}, true},
		{"mailbox", func(c *Config) { c.MailboxCapacity = 0 }, false},
		{"permits", func(c *Config) { c.PayloadPermits = -1 }, false},
		{"delay", func(c *Config) { c.PublicationDelay = 0 }, false},
		{"faults", func(c *Config) { c.FaultCapacity = 0 }, false},
		{"subscriber buffer", func(c *Config) { c.SubscriberBuffer = 0 }, false},
		{"quiet window", func(c *Config) { c.RecoveryQuietWindow = 0 }, false},
		{"initial deadline", func(c *Config) { c.InitialRecoveryDeadline = -time.Second }, false},
		{"idle source epochs", func(c *Config) { c.MaxIdleSourceEpochs = 0 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.mutate(&c)
			err := c.Validate()
			if tt.ok {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrInvalidConfig)
			_, _, err = Start(newTestPool(t, 32, 1), testScope(), c)
			require.ErrorIs(t, err, ErrInvalidConfig, "Start")
		})
	}
	_, _, err := Start(nil, testScope(), DefaultConfig())
	require.ErrorIs(t, err, ErrInvalidConfig, "Start(nil pool)")
}

// TestActor_AdmitEventsAppliesEachEventAsIfAdmittedAlone admits the same
// events one by one to one actor and as one AdmitEvents batch to another:
// an unknown removal, a fault and a clear in the middle of the batch must not
// stop or change the events after them.
func TestActor_AdmitEventsAppliesEachEventAsIfAdmittedAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w2 := ckf.Member{WorkerID: 2}
		orphan := stored(w2, 3, 30)
		orphan.HasParent, orphan.ParentHash = true, 999 // a parent w2 never stored
		evs := []ckf.RouterEvent{
			stored(worker1, 1, 1, 2),
			removed(worker1, 2, 77), // unknown removal: counted, not a fault
			orphan,                  // a fault
			stored(w2, 4, 40, 41),
			stored(worker1, 5, 3),
			{WorkerID: 2, EventID: 6, Kind: ckf.EventCleared},
			stored(w2, 7, 50),
		}
		oneByOne, faultsA := startActor(t, actorOpts{})
		batched, faultsB := startActor(t, actorOpts{})
		for _, ev := range evs {
			mustAdmit(t, oneByOne, 0, ev)
		}
		require.NoError(t, batched.AdmitEvents(t.Context(), 0, slices.Clone(evs)))
		mustFlush(t, oneByOne)
		mustFlush(t, batched)

		a, b := mustStats(t, oneByOne), mustStats(t, batched)
		assert.Equal(t, uint64(1), b.Faults, "the orphan faults")
		assert.Equal(t, uint64(1), b.UnknownRemovalEvents)
		assert.Equal(t, 4, b.Pool.UniqueBlocks, "1, 2 and 3 of worker 1; 50 of worker 2 after its clear")
		a.Sequence, b.Sequence = 0, 0 // one publication per cadence either way; compare the state
		assert.Equal(t, a, b)
		fa, fb := <-faultsA, <-faultsB
		assert.Equal(t, fa.EventID, fb.EventID)
		assert.Equal(t, fa.Category, fb.Category)
	})
}

// TestActor_AdmitEventsWeighsTheWholeBatch checks the permits of a batch: its
// summed block count (capped at PayloadPermits, so a batch heavier than the
// pool is still admitted), held until the whole batch ran.
func TestActor_AdmitEventsWeighsTheWholeBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{mutate: func(c *Config) { c.PayloadPermits = 4 }})
		release := pauseActor(t, h)
		require.NoError(t, h.AdmitEvents(t.Context(), 0, []ckf.RouterEvent{stored(worker1, 1, 1), stored(worker1, 2, 2, 3)})) // weight 3 of 4
		second := make(chan error, 1)
		go func() {
			second <- h.AdmitEvents(context.Background(), 0, []ckf.RouterEvent{stored(worker1, 3, 4), stored(worker1, 4, 5)})
		}()
		synctest.Wait()
		select {
		case err := <-second:
			require.FailNow(t, "a batch of weight 2 returned with 1 permit free", "%v", err)
		default:
		}
		release()
		require.NoError(t, <-second)
		// Heavier than every permit: capped, not refused.
		require.NoError(t, h.AdmitEvents(t.Context(), 0, []ckf.RouterEvent{stored(worker1, 5, 6, 7, 8), stored(worker1, 6, 9, 10, 11)}))
		require.NoError(t, h.AdmitEvents(t.Context(), 0, nil), "an empty batch is a no-op")
		mustFlush(t, h)
		assert.Equal(t, 11, mustStats(t, h).Pool.UniqueBlocks)
		// Every permit came back: a full-weight admission does not wait.
		require.NoError(t, h.AdmitEvents(t.Context(), 0, []ckf.RouterEvent{stored(worker1, 7, 12, 13, 14, 15)}))
	})
}

// TestFaultedEventLeavesNoEpochRecord: an event that faults is not
// journalled, so it must not leave a source-epoch record either — a replica
// or a restart replaying the journal would have none, and the exact states
// would differ (issue #34's property test found it).
func TestFaultedEventLeavesNoEpochRecord(t *testing.T) {
	h, faults := startActor(t, actorOpts{})
	stranger := ckf.Member{WorkerID: 9}
	ev := stored(stranger, 1, 5)
	ev.HasParent, ev.ParentHash = true, 77 // a parent it never stored
	mustAdmit(t, h, 3, ev)
	f := <-faults
	require.Equal(t, stranger, f.Member)
	st, err := h.ExportState(t.Context())
	require.NoError(t, err)
	assert.Empty(t, st.Members, "the faulted event left a record: %+v", st.Members)
	// The member is unknown again: its next event, at any epoch, sets it.
	mustAdmit(t, h, 1, stored(stranger, 2, 6))
	st, err = h.ExportState(t.Context())
	require.NoError(t, err)
	require.Len(t, st.Members, 1)
	assert.Equal(t, uint64(1), st.Members[0].SourceEpoch)
}

// TestReincarnateIsANewIdentityWithTheSameState: a replica that becomes its
// group's leader publishes as a new incarnation (issue #34): the current
// subscription ends superseded, the next one's snapshot carries the new
// identity from sequence 0 with the same words.
func TestReincarnateIsANewIdentityWithTheSameState(t *testing.T) {
	h, _ := startActor(t, actorOpts{})
	mustAdmit(t, h, 1, stored(worker1, 1, 10, 11, 12))
	mustFlush(t, h)
	sub, err := h.Subscribe(t.Context(), testLease(1))
	require.NoError(t, err)
	old := sub.Snapshot
	require.Equal(t, uint64(4), old.Identity.ProducerIncarnation)

	require.NoError(t, h.Reincarnate(t.Context(), 99))
	for range sub.Deltas() {
	}
	require.ErrorIs(t, sub.Err(), ErrSuperseded)
	assert.Equal(t, uint64(99), h.Identity().ProducerIncarnation)

	sub2, err := h.Subscribe(t.Context(), testLease(2))
	require.NoError(t, err)
	snap := sub2.Snapshot
	want := old.Identity
	want.ProducerIncarnation = 99
	assert.Equal(t, want, snap.Identity)
	assert.Zero(t, snap.Sequence, "a new incarnation's sequence starts again")
	assert.Equal(t, old.Words, snap.Words, "the state is unchanged")
	// Admissions go on under the new identity.
	mustAdmit(t, h, 1, stored(worker1, 2, 13))
	mustFlush(t, h)
	d := <-sub2.Deltas()
	assert.Equal(t, want, d.Identity)
	assert.Equal(t, uint64(1), d.Sequence)
	assert.Equal(t, 4, mustStats(t, h).Pool.UniqueBlocks)
}
