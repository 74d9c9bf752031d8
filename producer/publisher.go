package producer

import (
	"math"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// Sink receives the deltas of one publisher in order: reliable FIFO handoff
// of one complete delta. A nil error means the next owner accepted the whole
// delta; an error means the publisher cannot prove continuation is safe, so it
// fences itself ([FenceDeliveryUncertain]) without advancing its sequence.
//
// Enqueue takes ownership of the delta (its Images slice included). It is
// called from the publisher's goroutine only.
type Sink interface {
	Enqueue(d ckf.Delta) error
}

// EmitOutcome reports what [Publisher.Publish] did with a batch.
type EmitOutcome struct {
	// Published is false when no lease is installed: the batch was dropped
	// (the next subscriber's snapshot covers it) and the sequence did not move.
	Published bool
	// Sequence is the delta's sequence when Published, else the unchanged
	// last sequence.
	Sequence uint64
	// ImageCount is the number of bucket images in the delta.
	ImageCount int
}

// Publisher owns one pool's serialized stream (SPEC §6): the producer
// identity, the current consumer lease (optional), the checked last sequence
// and the fence reason. It turns unsequenced [ckf.Batch]es into
// [ckf.Delta]s for its [Sink] and cuts [ckf.Snapshot]s at barriers.
// Sequences count emitted batches, not events.
//
// A Publisher is owned by one goroutine (the actor's); it is not safe for
// concurrent use. The zero value is not usable; see [NewPublisher].
type Publisher struct {
	identity ckf.ProducerIdentity
	lease    ckf.LaneLease
	hasLease bool
	last     uint64
	fence    FenceReason
	sink     Sink
}

// NewPublisher returns an unfenced publisher without a lease whose first
// delta will carry sequence initialSequence+1.
func NewPublisher(identity ckf.ProducerIdentity, initialSequence uint64, sink Sink) *Publisher {
	return &Publisher{identity: identity, last: initialSequence, sink: sink}
}

// Identity returns the producer identity stamped on every delta and snapshot.
func (p *Publisher) Identity() ckf.ProducerIdentity { return p.identity }

// Lease returns the installed lease; ok is false when there is none.
func (p *Publisher) Lease() (lease ckf.LaneLease, ok bool) { return p.lease, p.hasLease }

// LastSequence returns the sequence of the last delta the sink accepted (or
// the initial / snapshot sequence).
func (p *Publisher) LastSequence() uint64 { return p.last }

// FenceReason returns why the publisher is fenced, or [NotFenced].
func (p *Publisher) FenceReason() FenceReason { return p.fence }

// Sink returns the publisher's sink.
func (p *Publisher) Sink() Sink { return p.sink }

// Publish sequences one batch and hands it to the sink.
//
//   - Fenced: a [*PublishError] for the current reason; nothing changes.
//   - No lease: the batch is dropped and the outcome is not Published.
//   - The next sequence would overflow: fence [FenceSequenceExhausted],
//     nothing is enqueued.
//   - The sink refuses the delta: fence [FenceDeliveryUncertain]; the
//     sequence does not advance and the error wraps the sink's error.
//
// A nil or empty batch returns [ErrEmptyBatch] and changes nothing. On
// success the delta owns b.Images.
func (p *Publisher) Publish(b *ckf.Batch) (EmitOutcome, error) {
	if b == nil || len(b.Images) == 0 {
		return EmitOutcome{Sequence: p.last}, ErrEmptyBatch
	}
	if p.fence != NotFenced {
		return EmitOutcome{Sequence: p.last}, &PublishError{Reason: p.fence, LastSequence: p.last}
	}
	if !p.hasLease {
		return EmitOutcome{Sequence: p.last}, nil
	}
	if p.last == math.MaxUint64 {
		p.fence = FenceSequenceExhausted
		return EmitOutcome{Sequence: p.last}, &PublishError{Reason: p.fence, LastSequence: p.last}
	}
	next := p.last + 1
	n := len(b.Images)
	d := ckf.Delta{Identity: p.identity, Lease: p.lease, BaseSequence: p.last, Sequence: next, Images: b.Images}
	if err := p.sink.Enqueue(d); err != nil {
		p.fence = FenceDeliveryUncertain
		return EmitOutcome{Sequence: p.last}, &PublishError{Reason: p.fence, LastSequence: p.last, Cause: err}
	}
	p.last = next
	return EmitOutcome{Published: true, Sequence: next, ImageCount: n}, nil
}

// SnapshotAfterBarrier installs lease from a barrier snapshot of pool
// (SPEC §6). It refuses with [ErrSequenceExhausted] (nothing taken) when the
// sequence is exhausted. Otherwise it takes [ckf.Pool.BarrierSnapshot]; when
// not fenced and a tail was pending, the tail is first published on the old
// lease — if that fails the error is returned and the lease is unchanged
// (the publisher is then fenced, so a retry skips the tail, which the retry's
// snapshot covers). Then the new lease is installed, the fence cleared, and
// the snapshot carries the last sequence N, so the first continuation is
// N → N+1. The snapshot owns its Words.
func (p *Publisher) SnapshotAfterBarrier(pool *ckf.Pool, lease ckf.LaneLease) (ckf.Snapshot, error) {
	if p.last == math.MaxUint64 || p.fence == FenceSequenceExhausted {
		return ckf.Snapshot{}, &PublishError{Reason: FenceSequenceExhausted, LastSequence: p.last}
	}
	tail, words := pool.BarrierSnapshot()
	if p.fence == NotFenced && tail != nil {
		if _, err := p.Publish(tail); err != nil {
			return ckf.Snapshot{}, err
		}
	}
	p.lease, p.hasLease = lease, true
	p.fence = NotFenced
	return ckf.Snapshot{Identity: p.identity, Lease: lease, Sequence: p.last, Words: words}, nil
}

// ExactDrainMarker returns (lease, last sequence): the exact terminal point of
// the current stream. ok is false without a lease.
func (p *Publisher) ExactDrainMarker() (m ckf.DrainMarker, ok bool) {
	if !p.hasLease {
		return ckf.DrainMarker{}, false
	}
	return ckf.DrainMarker{Lease: p.lease, ExpectedSequence: p.last}, true
}

// RetireLease drops the lease; later batches are dropped until a new lease.
func (p *Publisher) RetireLease() { p.lease, p.hasLease = ckf.LaneLease{}, false }

// RetireStalledLease drops the lease and fences [FenceLeaseStalled]: the
// subscriber fell behind, and only a new snapshot may restart the stream.
func (p *Publisher) RetireStalledLease() {
	p.RetireLease()
	p.fence = FenceLeaseStalled
}
