package producer

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// pauseActor parks the actor inside a test-only command and returns the
// function that releases it. The actor has dequeued everything before it.
func pauseActor(t *testing.T, h Handle) (release func()) {
	t.Helper()
	p := &pause{entered: make(chan struct{}), release: make(chan struct{})}
	if err := h.a.send(t.Context(), &command{kind: cmdPause, pause: p}); err != nil {
		t.Fatalf("pause: %v", err)
	}
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
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	if o.mutate != nil {
		o.mutate(&cfg)
	}
	h, faults, err := Start(pool, testScope(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Fence(context.Background()) })
	return h, faults
}

func mustAdmit(t *testing.T, h Handle, epoch uint64, ev ckf.RouterEvent) {
	t.Helper()
	if err := h.AdmitEvent(t.Context(), epoch, ev); err != nil {
		t.Fatalf("AdmitEvent: %v", err)
	}
}

func mustStats(t *testing.T, h Handle) ActorStats {
	t.Helper()
	s, err := h.Stats(t.Context())
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	return s
}

func mustFlush(t *testing.T, h Handle) {
	t.Helper()
	if err := h.Flush(t.Context()); err != nil {
		t.Fatalf("Flush: %v", err)
	}
}

func mustSubscribe(t *testing.T, h Handle, epoch uint64) *Subscription {
	t.Helper()
	s, err := h.Subscribe(t.Context(), testLease(epoch))
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	return s
}

// recvDelta waits for the next delta; in a synctest bubble the one-minute
// limit is fake time, so a missing delta fails fast instead of hanging.
func recvDelta(t *testing.T, s *Subscription) ckf.Delta {
	t.Helper()
	select {
	case d, ok := <-s.Deltas():
		if !ok {
			t.Fatalf("stream ended: %v", s.Err())
		}
		return d
	case <-time.After(time.Minute):
		t.Fatal("no delta within a minute")
	}
	return ckf.Delta{}
}

// noDelta fails if a delta is ready on s.
func noDelta(t *testing.T, s *Subscription) {
	t.Helper()
	select {
	case d, ok := <-s.Deltas():
		t.Fatalf("unexpected delta %+v (open %v)", d, ok)
	default:
	}
}

func noFault(t *testing.T, faults <-chan Fault) {
	t.Helper()
	select {
	case f := <-faults:
		t.Fatalf("unexpected fault: %v", f)
	default:
	}
}

func TestActor_AdmissionCompletesBeforePausedActorApplies(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{mutate: func(c *Config) { c.MailboxCapacity = 4 }})
		release := pauseActor(t, h)
		mustAdmit(t, h, 0, stored(worker1, 1, 1)) // the actor is parked: this cannot wait for mutation
		if got := h.MailboxDepth(); got != 1 {
			t.Fatalf("mailbox depth: got %d want 1", got)
		}
		release()
		mustFlush(t, h)
		if got := mustStats(t, h).Pool.UniqueBlocks; got != 1 {
			t.Fatalf("unique blocks: got %d want 1", got)
		}
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
			t.Fatalf("second admission returned %v while the mailbox was full", err)
		default:
		}
		release()
		if err := <-second; err != nil {
			t.Fatalf("second admission: %v", err)
		}
		mustFlush(t, h)
		if got := mustStats(t, h).Pool.UniqueBlocks; got != 2 {
			t.Fatalf("unique blocks: got %d want 2", got)
		}
	})
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
			t.Fatalf("a 2-block admission returned %v with 1 permit free", err)
		default:
		}
		release()
		if err := <-second; err != nil {
			t.Fatal(err)
		}
		// An event heavier than the whole pool is capped, not refused.
		mustAdmit(t, h, 0, stored(worker1, 3, 6, 7, 8, 9, 10, 11))
		mustFlush(t, h)
		if got := mustStats(t, h).Pool.UniqueBlocks; got != 11 {
			t.Fatalf("unique blocks: got %d want 11", got)
		}
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
		if err != nil {
			t.Fatalf("ReplaceRanks: %v", err)
		}
		d := recvDelta(t, sub)
		if d.BaseSequence != base || d.Sequence != base+1 {
			t.Fatalf("delta: got %d→%d want %d→%d", d.BaseSequence, d.Sequence, base, base+1)
		}
		mustFlush(t, h)
		noDelta(t, sub)
		// The one delta takes the snapshot to the rebuilt table.
		words := applyDeltas(t, sub.Snapshot.Words, d)
		if got := mustSubscribe(t, h, 2).Snapshot.Words; !equalWords(words, got) {
			t.Fatalf("snapshot + delta differs from the rebuilt table")
		}
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

func equalWords(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
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
		if err := h.AdmitEvent(t.Context(), 0, stored(worker1, 2, 2)); !errors.Is(err, ErrShuttingDown) || errors.Is(err, ErrFenced) {
			t.Fatalf("admission during shutdown: got %v want ErrShuttingDown", err)
		}
		release()
		if err := <-done; err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		// The admitted event was applied and its tail published before the end.
		d, ok := <-sub.Deltas()
		if !ok || d.BaseSequence != 0 || d.Sequence != 1 {
			t.Fatalf("tail: got %+v open %v, want 0→1", d, ok)
		}
		if _, ok := <-sub.Deltas(); ok {
			t.Fatal("stream still open after shutdown")
		}
		if !errors.Is(sub.Err(), ErrShuttingDown) {
			t.Fatalf("stream end: got %v want ErrShuttingDown", sub.Err())
		}
		if m, ok := sub.DrainMarker(); !ok || m.ExpectedSequence != 1 || m.Lease != testLease(1) {
			t.Fatalf("drain marker: got %+v %v want lease 1 at 1", m, ok)
		}
		if owners, _ := h.a.pool.Owners(1); owners != 1 {
			t.Fatalf("owners of block 1 after shutdown: got %d want 1", owners)
		}
		if err := h.AdmitEvent(t.Context(), 0, stored(worker1, 3, 3)); !errors.Is(err, ErrShuttingDown) {
			t.Fatalf("admission after shutdown: got %v want ErrShuttingDown", err)
		}
		if err := h.Shutdown(t.Context()); !errors.Is(err, ErrShuttingDown) {
			t.Fatalf("second Shutdown: got %v want ErrShuttingDown", err)
		}
		if _, ok := <-faults; ok {
			t.Fatal("fault channel open after shutdown")
		}
	})
}

func TestActor_FenceRetiresStreamWithoutUncertainTail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{cadence: 16, mutate: func(c *Config) { c.PublicationDelay = 10 * time.Second }})
		sub := mustSubscribe(t, h, 1)
		mustAdmit(t, h, 0, stored(worker1, 1, 1))
		synctest.Wait() // the event is applied: a dirty tail is pending
		if err := h.Fence(t.Context()); err != nil {
			t.Fatalf("Fence: %v", err)
		}
		if d, ok := <-sub.Deltas(); ok {
			t.Fatalf("fence published the uncertain tail %+v", d)
		}
		if !errors.Is(sub.Err(), ErrFenced) {
			t.Fatalf("stream end: got %v want ErrFenced", sub.Err())
		}
		err := h.AdmitEvent(t.Context(), 0, stored(worker1, 2, 2))
		if !errors.Is(err, ErrShuttingDown) || !errors.Is(err, ErrFenced) {
			t.Fatalf("admission after fence: got %v want ErrShuttingDown and ErrFenced", err)
		}
		if err := h.Flush(t.Context()); !errors.Is(err, ErrFenced) {
			t.Fatalf("Flush after fence: got %v want ErrFenced", err)
		}
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
		if err := <-fenced; err != nil {
			t.Fatal(err)
		}
		if err := <-flushed; !errors.Is(err, ErrFenced) {
			t.Fatalf("queued Flush: got %v want ErrFenced", err)
		}
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
		if len(faults) != DefaultFaultCapacity || h.MailboxDepth() != 0 {
			t.Fatalf("got %d faults and depth %d, want %d and 0", len(faults), h.MailboxDepth(), DefaultFaultCapacity)
		}
		if err := h.Fence(t.Context()); err != nil { // would deadlock the bubble if not interrupted
			t.Fatalf("Fence: %v", err)
		}
		f := <-faults
		if f.Category != FaultSourceProtocol || !errors.Is(f.Err, ErrUnannouncedSourceEpoch) ||
			f.Member != worker1 || f.SourceEpoch != 1 || f.EventID != 2 || f.Disposition.Action != ckf.RejectSource {
			t.Fatalf("fault: got %v", f)
		}
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
		if s.Sequence != 0 || s.Pool.PendingEvents != 15 {
			t.Fatalf("after 15: got sequence %d pending %d, want 0 and 15", s.Sequence, s.Pool.PendingEvents)
		}
		noDelta(t, sub)
		mustAdmit(t, h, 0, stored(worker1, 16, 7))
		d := recvDelta(t, sub)
		if d.BaseSequence != 0 || d.Sequence != 1 {
			t.Fatalf("delta: got %d→%d want 0→1", d.BaseSequence, d.Sequence)
		}
		s = mustStats(t, h)
		if s.Pool.PendingEvents != 0 || s.Pool.UniqueBlocks != 1 {
			t.Fatalf("after 16: got pending %d unique %d, want 0 and 1", s.Pool.PendingEvents, s.Pool.UniqueBlocks)
		}
	})
}

func TestActor_TimerPublishesSparseTailWithoutFlush(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{cadence: 16})
		sub := mustSubscribe(t, h, 1)
		start := time.Now()
		mustAdmit(t, h, 0, stored(worker1, 1, 7))
		d := recvDelta(t, sub) // fake time advances only to the timer
		if waited := time.Since(start); waited != DefaultPublicationDelay {
			t.Fatalf("published after %v, want exactly %v", waited, DefaultPublicationDelay)
		}
		if d.BaseSequence != 0 || d.Sequence != 1 {
			t.Fatalf("delta: got %d→%d want 0→1", d.BaseSequence, d.Sequence)
		}
		if got := mustStats(t, h).Sequence; got != 1 {
			t.Fatalf("sequence: got %d want 1", got)
		}
	})
}

func TestActor_ReplacementSubscriptionStartsAfterOldLeaseTail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{cadence: 16, mutate: func(c *Config) { c.PublicationDelay = 10 * time.Second }})
		old := mustSubscribe(t, h, 1)
		mustAdmit(t, h, 0, stored(worker1, 1, 7))
		repl := mustSubscribe(t, h, 2)
		tail, ok := <-old.Deltas()
		if !ok || tail.Lease != testLease(1) {
			t.Fatalf("old tail: got %+v open %v, want a delta on lease 1", tail, ok)
		}
		if repl.Snapshot.Sequence != tail.Sequence {
			t.Fatalf("replacement snapshot at %d, old tail at %d", repl.Snapshot.Sequence, tail.Sequence)
		}
		if _, ok := <-old.Deltas(); ok || !errors.Is(old.Err(), ErrSuperseded) {
			t.Fatalf("old stream: open %v err %v, want closed with ErrSuperseded", ok, old.Err())
		}
		noDelta(t, repl)
		mustAdmit(t, h, 0, stored(worker1, 2, 8))
		mustFlush(t, h)
		c := recvDelta(t, repl)
		if c.Lease != testLease(2) || c.BaseSequence != repl.Snapshot.Sequence || c.Sequence != repl.Snapshot.Sequence+1 {
			t.Fatalf("continuation: got lease %+v %d→%d, want lease 2 %d→%d", c.Lease, c.BaseSequence, c.Sequence,
				repl.Snapshot.Sequence, repl.Snapshot.Sequence+1)
		}
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
		if s.HasLease || s.Fence != FenceLeaseStalled || s.Sequence != 1 {
			t.Fatalf("after lag: lease %v fence %v sequence %d, want none, LeaseStalled, 1", s.HasLease, s.Fence, s.Sequence)
		}
		if d, ok := <-sub.Deltas(); !ok || d.Sequence != 1 {
			t.Fatalf("buffered delta: got %+v open %v", d, ok)
		}
		if _, ok := <-sub.Deltas(); ok || !errors.Is(sub.Err(), ErrLagged) {
			t.Fatalf("lagged stream: open %v err %v, want closed with ErrLagged", ok, sub.Err())
		}
		// A new lease restarts from a snapshot that covers the skipped deltas.
		again := mustSubscribe(t, h, 2)
		if again.Snapshot.Sequence != 1 {
			t.Fatalf("resubscribe at %d, want 1", again.Snapshot.Sequence)
		}
		for _, b := range []uint64{1, 2, 3} {
			if !containsWords(h, again.Snapshot.Words, b) {
				t.Fatalf("resubscribe snapshot misses block %d", b)
			}
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
		if s.Pool.UniqueBlocks != 32 || s.Pool.CapacityFailures == 0 || s.CapacityOmissionEvents != 1 {
			t.Fatalf("got unique %d capacity failures %d omission events %d, want 32, > 0, 1",
				s.Pool.UniqueBlocks, s.Pool.CapacityFailures, s.CapacityOmissionEvents)
		}
		noFault(t, faults)
		mustAdmit(t, h, 0, stored(worker1, 2, 1))
		mustFlush(t, h)
		synctest.Wait()
		noFault(t, faults)
		if s := mustStats(t, h); s.Faults != 0 {
			t.Fatalf("faults sent: got %d want 0", s.Faults)
		}
	})
}

func TestActor_FailedReplacementReturnsErrorWithoutFault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, faults := startActor(t, actorOpts{})
		mustAdmit(t, h, 0, stored(worker1, 1, 1))
		foreign := ckf.Member{WorkerID: 2}
		err := h.ReplaceRanks(t.Context(), []RankReplacement{{Member: worker1,
			Events: []ckf.RouterEvent{stored(foreign, 1, 9)}}})
		if !errors.Is(err, ckf.ErrInvalidReplacement) {
			t.Fatalf("ReplaceRanks: got %v want ckf.ErrInvalidReplacement", err)
		}
		synctest.Wait()
		noFault(t, faults)
		s := mustStats(t, h)
		if s.Pool.UniqueBlocks != 1 || len(s.Members) != 1 || s.Members[0].Member != worker1 {
			t.Fatalf("state changed by a failed replacement: %+v", s.Members)
		}
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
		{"ownership overflow", ckf.ErrOwnershipDegreeOverflow, ckf.RejectSource, 0, FaultSourceProtocol},
		{"parent not found", ckf.ErrParentBlockNotFound, ckf.RejectSource, 0, FaultSourceProtocol},
		{"invalid sequence", ckf.ErrInvalidBlockSequence, ckf.RejectSource, 0, FaultSourceProtocol},
		{"invariant", ckf.ErrIndexerInvariantViolation, ckf.FenceAndRebuildProducer, ckf.ProducerCore, FaultProducerInvariant},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := &ckf.EventError{Kind: tt.err, Member: worker1}
			d, ok := ckf.DispositionOf(ckf.FailurePointOf(err))
			if !ok {
				t.Fatal("no disposition")
			}
			if d.Action != tt.action || d.Domain != ckf.ProducerCore || d.Commit != ckf.KnownUnchanged || d.RecoveryDomain != tt.recovery {
				t.Fatalf("disposition: got %+v want action %v in ProducerCore, KnownUnchanged, recovery %v", d, tt.action, tt.recovery)
			}
			c, isFault := CategoryOf(d.Action)
			if isFault != (tt.category != 0) || c != tt.category {
				t.Fatalf("category: got %v %v want %v", c, isFault, tt.category)
			}
		})
	}
	for _, a := range []ckf.RecoveryAction{ckf.DeactivateAndSnapshot, ckf.RetrySnapshot} {
		if _, ok := CategoryOf(a); ok {
			t.Errorf("consumer-lane action %v mapped to a producer fault", a)
		}
	}
}

func TestActor_StaleSourceEpochCannotMutateOrFaultReplacedRank(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, faults := startActor(t, actorOpts{})
		mustAdmit(t, h, 1, stored(worker1, 1, 1))
		if err := h.ResetRank(t.Context(), 2, worker1, false); err != nil {
			t.Fatalf("ResetRank: %v", err)
		}
		mustAdmit(t, h, 1, stored(worker1, 2, 2))
		mustFlush(t, h)
		s := mustStats(t, h)
		if s.Pool.UniqueBlocks != 0 || s.StaleEventsDropped != 1 {
			t.Fatalf("got unique %d stale drops %d, want 0 and 1", s.Pool.UniqueBlocks, s.StaleEventsDropped)
		}
		want := &StaleSourceEpochError{Member: worker1, Current: 2, Received: 1}
		err := h.ResetRank(t.Context(), 1, worker1, false)
		var se *StaleSourceEpochError
		if !errors.As(err, &se) || *se != *want {
			t.Fatalf("stale ResetRank: got %v want %v", err, want)
		}
		err = h.ReplaceRanks(t.Context(), []RankReplacement{{SourceEpoch: 1, Member: worker1,
			Events: []ckf.RouterEvent{stored(worker1, 3, 3)}}})
		if !errors.As(err, &se) || *se != *want {
			t.Fatalf("stale ReplaceRanks: got %v want %v", err, want)
		}
		synctest.Wait()
		noFault(t, faults)
		if s := mustStats(t, h); s.Pool.UniqueBlocks != 0 {
			t.Fatalf("stale replacement mutated: unique %d", s.Pool.UniqueBlocks)
		}
		// The current epoch still works.
		mustAdmit(t, h, 2, stored(worker1, 4, 4))
		mustFlush(t, h)
		if s := mustStats(t, h); s.Pool.UniqueBlocks != 1 {
			t.Fatalf("current-epoch event: unique %d want 1", s.Pool.UniqueBlocks)
		}
	})
}

func TestActor_DegradedResetIsCountedAndPublishesZeroImages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{mutate: func(c *Config) { c.Diagnostics = true }})
		sub := mustSubscribe(t, h, 1)
		mustAdmit(t, h, 0, stored(worker1, 1, 1))
		recvDelta(t, sub)
		if err := h.ResetRank(t.Context(), 0, worker1, true); err != nil {
			t.Fatal(err)
		}
		d := recvDelta(t, sub)
		if len(d.Images) == 0 || d.Images[0].Word != 0 {
			t.Fatalf("reset delta: got %+v want a zero image", d.Images)
		}
		s := mustStats(t, h)
		if s.DegradedResets != 1 || s.Pool.Members != 0 {
			t.Fatalf("got degraded %d members %d, want 1 and 0", s.DegradedResets, s.Pool.Members)
		}
		dg, ok := h.Diagnostics()
		if !ok || dg.DegradedResets != 1 || dg.Publications != 2 {
			t.Fatalf("diagnostics: got %+v %v, want 1 degraded reset and 2 publications", dg, ok)
		}
	})
}

func TestActor_DiagnosticsOffByDefault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{})
		if _, ok := h.Diagnostics(); ok {
			t.Fatal("diagnostics enabled by default")
		}
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
		if !errors.Is(err, ErrNotStarted) {
			t.Errorf("%s: got %v want ErrNotStarted", name, err)
		}
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
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.mutate(&c)
			err := c.Validate()
			if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrInvalidConfig)) {
				t.Fatalf("Validate: got %v, want ok=%v", err, tt.ok)
			}
			if !tt.ok {
				if _, _, err := Start(newTestPool(t, 32, 1), testScope(), c); !errors.Is(err, ErrInvalidConfig) {
					t.Fatalf("Start: got %v want ErrInvalidConfig", err)
				}
			}
		})
	}
	if _, _, err := Start(nil, testScope(), DefaultConfig()); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Start(nil pool): got %v want ErrInvalidConfig", err)
	}
}
