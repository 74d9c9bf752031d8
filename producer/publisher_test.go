package producer

import (
	"errors"
	"math"
	"testing"

	"github.com/ckfrelay/ckfrelay/ckf"
)

var errDisconnected = errors.New("disconnected")

func newTestPublisher(pool *ckf.Pool, initial uint64) (*Publisher, *recordingSink) {
	sink := &recordingSink{}
	return NewPublisher(testScope().Identity(pool.Format()), initial, sink), sink
}

func TestPublisher_CheckedSequenceAndSnapshotContinuation(t *testing.T) {
	pool := newTestPool(t, 32, 1)
	pub, sink := newTestPublisher(pool, 7)
	snap, err := pub.SnapshotAfterBarrier(pool, testLease(1))
	if err != nil {
		t.Fatalf("SnapshotAfterBarrier: %v", err)
	}
	if snap.Sequence != 7 {
		t.Fatalf("snapshot sequence: got %d want 7", snap.Sequence)
	}
	out, err := pub.Publish(applyBatch(t, pool, stored(worker1, 1, 11)))
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if want := (EmitOutcome{Published: true, Sequence: 8, ImageCount: 1}); out != want {
		t.Fatalf("outcome: got %+v want %+v", out, want)
	}
	d := sink.deltas[0]
	if d.BaseSequence != 7 || d.Sequence != 8 || d.Lease != testLease(1) || d.Identity != pub.Identity() {
		t.Fatalf("delta: got base %d seq %d lease %+v, want 7→8 on lease 1", d.BaseSequence, d.Sequence, d.Lease)
	}
	m, ok := pub.ExactDrainMarker()
	if !ok || m.ExpectedSequence != 8 || m.Lease != testLease(1) {
		t.Fatalf("drain marker: got %+v %v want lease 1 at 8", m, ok)
	}
}

func TestPublisher_FinalRemoveIsAbsoluteZeroImage(t *testing.T) {
	pool := newTestPool(t, 32, 1)
	pub, sink := newTestPublisher(pool, 0)
	if _, err := pub.SnapshotAfterBarrier(pool, testLease(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(applyBatch(t, pool, stored(worker1, 1, 11))); err != nil {
		t.Fatal(err)
	}
	b, err := pool.RemoveRank(worker1)
	if err != nil || b == nil {
		t.Fatalf("RemoveRank: got batch %v err %v, want a batch", b, err)
	}
	if _, err := pub.Publish(b); err != nil {
		t.Fatal(err)
	}
	if len(sink.deltas) != 2 {
		t.Fatalf("deltas: got %d want 2", len(sink.deltas))
	}
	zero := false
	for _, im := range sink.deltas[1].Images {
		zero = zero || im.Word == 0
	}
	if !zero {
		t.Fatalf("final remove delta %+v has no explicit zero image", sink.deltas[1].Images)
	}
}

func TestPublisher_DeliveryUncertaintyDoesNotAdvanceAndRecoversWithNewLease(t *testing.T) {
	pool := newTestPool(t, 32, 1)
	pub, sink := newTestPublisher(pool, 9)
	if _, err := pub.SnapshotAfterBarrier(pool, testLease(1)); err != nil {
		t.Fatal(err)
	}
	sink.fail = errDisconnected
	_, err := pub.Publish(applyBatch(t, pool, stored(worker1, 1, 11)))
	var pe *PublishError
	if !errors.As(err, &pe) || !errors.Is(err, errDisconnected) || !errors.Is(err, ErrDeliveryUncertain) {
		t.Fatalf("Publish error: got %v, want a delivery-uncertain PublishError wrapping the sink error", err)
	}
	if got := pub.LastSequence(); got != 9 {
		t.Fatalf("last sequence: got %d want 9", got)
	}
	if got := pub.FenceReason(); got != FenceDeliveryUncertain {
		t.Fatalf("fence: got %v want DeliveryUncertain", got)
	}
	// While fenced, further batches are refused without touching the sink.
	if _, err := pub.Publish(applyBatch(t, pool, stored(worker1, 2, 12))); !errors.Is(err, ErrPublisherFenced) || errors.Is(err, errDisconnected) {
		t.Fatalf("Publish while fenced: got %v, want a plain fence error", err)
	}

	sink.fail = nil
	snap, err := pub.SnapshotAfterBarrier(pool, testLease(2))
	if err != nil {
		t.Fatalf("SnapshotAfterBarrier: %v", err)
	}
	if snap.Sequence != 9 || snap.Lease != testLease(2) {
		t.Fatalf("snapshot: got seq %d lease %+v, want 9 on lease 2", snap.Sequence, snap.Lease)
	}
	if pub.FenceReason() != NotFenced {
		t.Fatalf("fence after new lease: got %v want NotFenced", pub.FenceReason())
	}
	if len(sink.deltas) != 0 {
		t.Fatalf("sink got %d deltas, want none", len(sink.deltas))
	}
}

func TestPublisher_ReplacementSnapshotEmitsHealthyOldTailFirst(t *testing.T) {
	pool := newTestPool(t, 32, 16)
	pub, sink := newTestPublisher(pool, 0)
	if _, err := pub.SnapshotAfterBarrier(pool, testLease(1)); err != nil {
		t.Fatal(err)
	}
	ev := stored(worker1, 1, 11)
	if out := pool.ApplyEvent(&ev); out.Batch != nil || out.FirstError != nil {
		t.Fatalf("ApplyEvent below cadence: got %+v, want no batch", out)
	}
	snap, err := pub.SnapshotAfterBarrier(pool, testLease(2))
	if err != nil {
		t.Fatal(err)
	}
	if snap.Sequence != 1 || snap.Lease != testLease(2) {
		t.Fatalf("snapshot: got seq %d lease %+v, want 1 on lease 2", snap.Sequence, snap.Lease)
	}
	if len(sink.deltas) != 1 {
		t.Fatalf("deltas: got %d want 1 (the old tail)", len(sink.deltas))
	}
	d := sink.deltas[0]
	if d.Lease != testLease(1) || d.BaseSequence != 0 || d.Sequence != 1 {
		t.Fatalf("tail: got lease %+v %d→%d, want lease 1 0→1", d.Lease, d.BaseSequence, d.Sequence)
	}
}

func TestPublisher_FailedOldTailNeedsRetryThenSnapshotCoversIt(t *testing.T) {
	pool := newTestPool(t, 32, 16)
	pub, sink := newTestPublisher(pool, 4)
	if _, err := pub.SnapshotAfterBarrier(pool, testLease(1)); err != nil {
		t.Fatal(err)
	}
	ev := stored(worker1, 1, 11)
	pool.ApplyEvent(&ev)
	sink.fail = errDisconnected
	if _, err := pub.SnapshotAfterBarrier(pool, testLease(2)); !errors.Is(err, errDisconnected) {
		t.Fatalf("SnapshotAfterBarrier: got %v, want the sink error", err)
	}
	if pub.LastSequence() != 4 {
		t.Fatalf("last sequence: got %d want 4", pub.LastSequence())
	}
	if l, ok := pub.Lease(); !ok || l != testLease(1) {
		t.Fatalf("lease after failed tail: got %+v %v, want lease 1 kept", l, ok)
	}
	sink.fail = nil
	snap, err := pub.SnapshotAfterBarrier(pool, testLease(2))
	if err != nil {
		t.Fatal(err)
	}
	if snap.Sequence != 4 || snap.Lease != testLease(2) {
		t.Fatalf("snapshot: got seq %d lease %+v, want 4 on lease 2", snap.Sequence, snap.Lease)
	}
	nonzero := false
	for _, w := range snap.Words {
		nonzero = nonzero || w != 0
	}
	if !nonzero {
		t.Fatal("the retry snapshot does not cover the lost tail")
	}
	if len(sink.deltas) != 0 {
		t.Fatalf("deltas: got %d want 0", len(sink.deltas))
	}
}

func TestPublisher_CheckedRolloverFencesWithoutEnqueueing(t *testing.T) {
	pool := newTestPool(t, 32, 1)
	pub, sink := newTestPublisher(pool, math.MaxUint64-1)
	if _, err := pub.SnapshotAfterBarrier(pool, testLease(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(applyBatch(t, pool, stored(worker1, 1, 11))); err != nil {
		t.Fatal(err)
	}
	_, err := pub.Publish(applyBatch(t, pool, stored(worker1, 2, 12)))
	if !errors.Is(err, ErrSequenceExhausted) {
		t.Fatalf("Publish at MaxUint64: got %v want ErrSequenceExhausted", err)
	}
	if len(sink.deltas) != 1 || pub.LastSequence() != math.MaxUint64 {
		t.Fatalf("got %d deltas at %d, want 1 at MaxUint64", len(sink.deltas), pub.LastSequence())
	}
	if _, err := pub.SnapshotAfterBarrier(pool, testLease(2)); !errors.Is(err, ErrSequenceExhausted) {
		t.Fatalf("SnapshotAfterBarrier: got %v want ErrSequenceExhausted", err)
	}
}

func TestPublisher_NoLeaseDropsBatchWithoutAdvancing(t *testing.T) {
	pool := newTestPool(t, 32, 1)
	pub, sink := newTestPublisher(pool, 3)
	out, err := pub.Publish(applyBatch(t, pool, stored(worker1, 1, 11)))
	if err != nil || out.Published || out.Sequence != 3 {
		t.Fatalf("Publish without lease: got %+v %v, want not published at 3", out, err)
	}
	if len(sink.deltas) != 0 {
		t.Fatalf("deltas: got %d want 0", len(sink.deltas))
	}
	if _, ok := pub.ExactDrainMarker(); ok {
		t.Fatal("drain marker without a lease")
	}
}

func TestPublisher_EmptyBatchChangesNothing(t *testing.T) {
	pool := newTestPool(t, 32, 1)
	pub, _ := newTestPublisher(pool, 0)
	if _, err := pub.SnapshotAfterBarrier(pool, testLease(1)); err != nil {
		t.Fatal(err)
	}
	for _, b := range []*ckf.Batch{nil, {}} {
		if _, err := pub.Publish(b); !errors.Is(err, ErrEmptyBatch) {
			t.Fatalf("Publish(%v): got %v want ErrEmptyBatch", b, err)
		}
	}
	if pub.LastSequence() != 0 || pub.FenceReason() != NotFenced {
		t.Fatalf("state changed: seq %d fence %v", pub.LastSequence(), pub.FenceReason())
	}
}

func TestPublisher_StalledLeaseFencesUntilNewSnapshot(t *testing.T) {
	pool := newTestPool(t, 32, 1)
	pub, sink := newTestPublisher(pool, 0)
	if _, err := pub.SnapshotAfterBarrier(pool, testLease(1)); err != nil {
		t.Fatal(err)
	}
	pub.RetireStalledLease()
	if _, err := pub.Publish(applyBatch(t, pool, stored(worker1, 1, 11))); !errors.Is(err, ErrLeaseStalled) {
		t.Fatalf("Publish after stall: got %v want ErrLeaseStalled", err)
	}
	snap, err := pub.SnapshotAfterBarrier(pool, testLease(2))
	if err != nil || snap.Sequence != 0 {
		t.Fatalf("SnapshotAfterBarrier: got seq %d err %v, want 0 nil", snap.Sequence, err)
	}
	if _, err := pub.Publish(applyBatch(t, pool, stored(worker1, 2, 12))); err != nil {
		t.Fatal(err)
	}
	if len(sink.deltas) != 1 || sink.deltas[0].BaseSequence != 0 || sink.deltas[0].Lease != testLease(2) {
		t.Fatalf("deltas: got %+v, want one 0→1 on lease 2", sink.deltas)
	}
}
