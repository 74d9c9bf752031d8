package producer

import (
	"errors"
	"math"
	"testing"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/stretchr/testify/require"
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
	require.NoError(t, err, "SnapshotAfterBarrier")
	require.Equal(t, uint64(7), snap.Sequence, "snapshot sequence: got %d want 7", snap.Sequence)
	out, err := pub.Publish(applyBatch(t, pool, stored(worker1, 1, 11)))
	require.NoError(t, err, "Publish")
	want := (EmitOutcome{Published: true, Sequence: 8, ImageCount: 1})
	require.Equal(t, want, out, "outcome: got %+v want %+v", out, want)
	d := sink.deltas[0]
	require.Equal(t, uint64(7), d.BaseSequence, "delta: got base %d seq %d lease %+v, want 7→8 on lease 1", d.BaseSequence, d.Sequence, d.Lease)
	require.Equal(t, uint64(8), d.Sequence, "delta: got base %d seq %d lease %+v, want 7→8 on lease 1", d.BaseSequence, d.Sequence, d.Lease)
	require.Equal(t, testLease(1), d.Lease, "delta: got base %d seq %d lease %+v, want 7→8 on lease 1", d.BaseSequence, d.Sequence, d.Lease)
	require.Equal(t, pub.Identity(), d.Identity, "delta: got base %d seq %d lease %+v, want 7→8 on lease 1", d.BaseSequence, d.Sequence, d.Lease)
	m, ok := pub.ExactDrainMarker()
	require.True(t, ok, "drain marker: got %+v %v want lease 1 at 8", m, ok)
	require.Equal(t, uint64(8), m.ExpectedSequence, "drain marker: got %+v %v want lease 1 at 8", m, ok)
	require.Equal(t, testLease(1), m.Lease, "drain marker: got %+v %v want lease 1 at 8", m, ok)
}

func TestPublisher_FinalRemoveIsAbsoluteZeroImage(t *testing.T) {
	pool := newTestPool(t, 32, 1)
	pub, sink := newTestPublisher(pool, 0)
	{
		_, err := pub.SnapshotAfterBarrier(pool, testLease(1))
		require.NoError(t, err)
	}
	{
		_, err := pub.Publish(applyBatch(t, pool, stored(worker1, 1, 11)))
		require.NoError(t, err)
	}
	b, err := pool.RemoveRank(worker1)
	require.NoError(t, err, "RemoveRank: got batch %v err %v, want a batch", b, err)
	require.NotNil(t, b, "RemoveRank: got batch %v err %v, want a batch", b, err)
	{
		_, err := pub.Publish(b)
		require.NoError(t, err)
	}
	require.Len(t, sink.deltas, 2, "deltas: got %d want 2", len(sink.deltas))
	zero := false
	for _, im := range sink.deltas[1].Images {
		zero = zero || im.Word == 0
	}
	require.True(t, zero, "final remove delta %+v has no explicit zero image", sink.deltas[1].Images)
}

func TestPublisher_DeliveryUncertaintyDoesNotAdvanceAndRecoversWithNewLease(t *testing.T) {
	pool := newTestPool(t, 32, 1)
	pub, sink := newTestPublisher(pool, 9)
	{
		_, err := pub.SnapshotAfterBarrier(pool, testLease(1))
		require.NoError(t, err)
	}
	sink.fail = errDisconnected
	_, err := pub.Publish(applyBatch(t, pool, stored(worker1, 1, 11)))
	var pe *PublishError
	require.ErrorAs(t, err, &pe, "Publish error: got %v, want a delivery-uncertain PublishError wrapping the sink error", err)
	require.ErrorIs(t, err, errDisconnected, "Publish error: got %v, want a delivery-uncertain PublishError wrapping the sink error", err)
	require.ErrorIs(t, err, ErrDeliveryUncertain, "Publish error: got %v, want a delivery-uncertain PublishError wrapping the sink error", err)
	got := pub.LastSequence()
	require.Equal(t, uint64(9), got, "last sequence: got %d want 9", got)
	{
		got := pub.FenceReason()
		require.Equal(t, FenceDeliveryUncertain, got, "fence: got %v want DeliveryUncertain", got)
	}
	// While fenced, further batches are refused without touching the sink.
	{
		_, err := pub.Publish(applyBatch(t, pool, stored(worker1, 2, 12)))
		require.ErrorIs(t, err, ErrPublisherFenced, "Publish while fenced: got %v, want a plain fence error", err)
		require.False(t, errors.Is(err, errDisconnected), "Publish while fenced: got %v, want a plain fence error", err)
	}

	sink.fail = nil
	snap, err := pub.SnapshotAfterBarrier(pool, testLease(2))
	require.NoError(t, err, "SnapshotAfterBarrier")
	require.Equal(t, uint64(9), snap.Sequence, "snapshot: got seq %d lease %+v, want 9 on lease 2", snap.Sequence, snap.Lease)
	require.Equal(t, testLease(2), snap.Lease, "snapshot: got seq %d lease %+v, want 9 on lease 2", snap.Sequence, snap.Lease)
	require.Equal(t, NotFenced, pub.FenceReason(), "fence after new lease: got %v want NotFenced", pub.FenceReason())
	require.Empty(t, sink.deltas, "sink got %d deltas, want none", len(sink.deltas))
}

func TestPublisher_ReplacementSnapshotEmitsHealthyOldTailFirst(t *testing.T) {
	pool := newTestPool(t, 32, 16)
	pub, sink := newTestPublisher(pool, 0)
	{
		_, err := pub.SnapshotAfterBarrier(pool, testLease(1))
		require.NoError(t, err)
	}
	ev := stored(worker1, 1, 11)
	out := pool.ApplyEvent(&ev)
	require.Nil(t, out.Batch, "ApplyEvent below cadence: got %+v, want no batch", out)
	require.NoError(t, out.FirstError, "ApplyEvent below cadence: got %+v, want no batch", out)
	snap, err := pub.SnapshotAfterBarrier(pool, testLease(2))
	require.NoError(t, err)
	require.Equal(t, uint64(1), snap.Sequence, "snapshot: got seq %d lease %+v, want 1 on lease 2", snap.Sequence, snap.Lease)
	require.Equal(t, testLease(2), snap.Lease, "snapshot: got seq %d lease %+v, want 1 on lease 2", snap.Sequence, snap.Lease)
	require.Len(t, sink.deltas, 1, "deltas: got %d want 1 (the old tail)", len(sink.deltas))
	d := sink.deltas[0]
	require.Equal(t, testLease(1), d.Lease, "tail: got lease %+v %d→%d, want lease 1 0→1", d.Lease, d.BaseSequence, d.Sequence)
	require.Equal(t, uint64(0), d.BaseSequence, "tail: got lease %+v %d→%d, want lease 1 0→1", d.Lease, d.BaseSequence, d.Sequence)
	require.Equal(t, uint64(1), d.Sequence, "tail: got lease %+v %d→%d, want lease 1 0→1", d.Lease, d.BaseSequence, d.Sequence)
}

func TestPublisher_FailedOldTailNeedsRetryThenSnapshotCoversIt(t *testing.T) {
	pool := newTestPool(t, 32, 16)
	pub, sink := newTestPublisher(pool, 4)
	{
		_, err := pub.SnapshotAfterBarrier(pool, testLease(1))
		require.NoError(t, err)
	}
	ev := stored(worker1, 1, 11)
	pool.ApplyEvent(&ev)
	sink.fail = errDisconnected
	{
		_, err := pub.SnapshotAfterBarrier(pool, testLease(2))
		require.ErrorIs(t, err, errDisconnected, "SnapshotAfterBarrier: got %v, want the sink error", err)
	}
	require.Equal(t, uint64(4), pub.LastSequence(), "last sequence: got %d want 4", pub.LastSequence())
	l, ok := pub.Lease()
	require.True(t, ok, "lease after failed tail: got %+v %v, want lease 1 kept", l, ok)
	require.Equal(t, testLease(1), l, "lease after failed tail: got %+v %v, want lease 1 kept", l, ok)
	sink.fail = nil
	snap, err := pub.SnapshotAfterBarrier(pool, testLease(2))
	require.NoError(t, err)
	require.Equal(t, uint64(4), snap.Sequence, "snapshot: got seq %d lease %+v, want 4 on lease 2", snap.Sequence, snap.Lease)
	require.Equal(t, testLease(2), snap.Lease, "snapshot: got seq %d lease %+v, want 4 on lease 2", snap.Sequence, snap.Lease)
	nonzero := false
	for _, w := range snap.Words {
		nonzero = nonzero || w != 0
	}
	require.True(t, nonzero, "the retry snapshot does not cover the lost tail")
	require.Empty(t, sink.deltas, "deltas: got %d want 0", len(sink.deltas))
}

func TestPublisher_CheckedRolloverFencesWithoutEnqueueing(t *testing.T) {
	pool := newTestPool(t, 32, 1)
	pub, sink := newTestPublisher(pool, math.MaxUint64-1)
	{
		_, err := pub.SnapshotAfterBarrier(pool, testLease(1))
		require.NoError(t, err)
	}
	{
		_, err := pub.Publish(applyBatch(t, pool, stored(worker1, 1, 11)))
		require.NoError(t, err)
	}
	_, err := pub.Publish(applyBatch(t, pool, stored(worker1, 2, 12)))
	require.ErrorIs(t, err, ErrSequenceExhausted, "Publish at MaxUint64: got %v want ErrSequenceExhausted", err)
	require.Len(t, sink.deltas, 1, "got %d deltas at %d, want 1 at MaxUint64", len(sink.deltas), pub.LastSequence())
	require.Equal(t, uint64(math.MaxUint64), pub.LastSequence(), "got %d deltas at %d, want 1 at MaxUint64", len(sink.deltas), pub.LastSequence())
	{
		_, err := pub.SnapshotAfterBarrier(pool, testLease(2))
		require.ErrorIs(t, err, ErrSequenceExhausted, "SnapshotAfterBarrier: got %v want ErrSequenceExhausted", err)
	}
}

func TestPublisher_NoLeaseDropsBatchWithoutAdvancing(t *testing.T) {
	pool := newTestPool(t, 32, 1)
	pub, sink := newTestPublisher(pool, 3)
	out, err := pub.Publish(applyBatch(t, pool, stored(worker1, 1, 11)))
	require.NoError(t, err, "Publish without lease: got %+v %v, want not published at 3", out, err)
	require.False(t, out.Published, "Publish without lease: got %+v %v, want not published at 3", out, err)
	require.Equal(t, uint64(3), out.Sequence, "Publish without lease: got %+v %v, want not published at 3", out, err)
	require.Empty(t, sink.deltas, "deltas: got %d want 0", len(sink.deltas))
	_, ok := pub.ExactDrainMarker()
	require.False(t, ok, "drain marker without a lease")
}

func TestPublisher_EmptyBatchChangesNothing(t *testing.T) {
	pool := newTestPool(t, 32, 1)
	pub, _ := newTestPublisher(pool, 0)
	_, err := pub.SnapshotAfterBarrier(pool, testLease(1))
	require.NoError(t, err)
	for _, b := range []*ckf.Batch{nil, {}} {
		_, err := pub.Publish(b)
		require.ErrorIs(t, err, ErrEmptyBatch, "Publish(%v): got %v want ErrEmptyBatch", b, err)
	}
	require.Equal(t, uint64(0), pub.LastSequence(), "state changed: seq %d fence %v", pub.LastSequence(), pub.FenceReason())
	require.Equal(t, NotFenced, pub.FenceReason(), "state changed: seq %d fence %v", pub.LastSequence(), pub.FenceReason())
}

func TestPublisher_StalledLeaseFencesUntilNewSnapshot(t *testing.T) {
	pool := newTestPool(t, 32, 1)
	pub, sink := newTestPublisher(pool, 0)
	{
		_, err := pub.SnapshotAfterBarrier(pool, testLease(1))
		require.NoError(t, err)
	}
	pub.RetireStalledLease()
	{
		_, err := pub.Publish(applyBatch(t, pool, stored(worker1, 1, 11)))
		require.ErrorIs(t, err, ErrLeaseStalled, "Publish after stall: got %v want ErrLeaseStalled", err)
	}
	snap, err := pub.SnapshotAfterBarrier(pool, testLease(2))
	require.NoError(t, err, "SnapshotAfterBarrier: got seq %d err %v, want 0 nil", snap.Sequence, err)
	require.Equal(t, uint64(0), snap.Sequence, "SnapshotAfterBarrier: got seq %d err %v, want 0 nil", snap.Sequence, err)
	{
		_, err := pub.Publish(applyBatch(t, pool, stored(worker1, 2, 12)))
		require.NoError(t, err)
	}
	require.Len(t, sink.deltas, 1, "deltas: got %+v, want one 0→1 on lease 2", sink.deltas)
	require.Equal(t, uint64(0), sink.deltas[0].BaseSequence, "deltas: got %+v, want one 0→1 on lease 2", sink.deltas)
	require.Equal(t, testLease(2), sink.deltas[0].Lease, "deltas: got %+v, want one 0→1 on lease 2", sink.deltas)
}
