package producer

import (
	"errors"
	"fmt"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// Publisher errors. A [*PublishError] wraps one of the fence sentinels and,
// when a sink refused a delta, the sink's error.
var (
	// ErrPublisherFenced is wrapped by every [*PublishError]: the publisher is
	// fenced and extends no stream until a new lease is installed by
	// [Publisher.SnapshotAfterBarrier].
	ErrPublisherFenced = errors.New("producer: publisher fenced")
	// ErrSequenceExhausted: the next sequence would overflow uint64. Only a
	// new producer generation (a new identity) can publish again.
	ErrSequenceExhausted = errors.New("producer: sequence exhausted")
	// ErrDeliveryUncertain: the sink refused a delta, so the publisher cannot
	// prove the stream is gapless; the sequence did not advance.
	ErrDeliveryUncertain = errors.New("producer: delivery uncertain")
	// ErrLeaseStalled: the lease's subscriber fell behind and was retired.
	ErrLeaseStalled = errors.New("producer: lease stalled")
	// ErrEmptyBatch: Publish was given a nil or empty batch (a pool never
	// produces one; nothing changes).
	ErrEmptyBatch = errors.New("producer: empty publication batch")
)

// Actor errors.
var (
	// ErrInvalidConfig is wrapped by every [Config.Validate] failure.
	ErrInvalidConfig = errors.New("producer: invalid config")
	// ErrNotStarted: the method was called on a zero [Handle].
	ErrNotStarted = errors.New("producer: actor not started")
	// ErrShuttingDown: the actor stopped admitting work (Shutdown or Fence).
	ErrShuttingDown = errors.New("producer: shutting down")
	// ErrFenced: the actor was fenced; its unpublished tail was discarded.
	// Errors returned after a fence match both ErrFenced and ErrShuttingDown.
	ErrFenced = errors.New("producer: fenced")
	// ErrStaleSourceEpoch is wrapped by [*StaleSourceEpochError].
	ErrStaleSourceEpoch = errors.New("producer: stale source epoch")
	// ErrUnannouncedSourceEpoch: an event carried a newer source epoch than
	// the member's without a reset or replacement barrier; it was not applied
	// and is reported as a [FaultSourceProtocol] fault.
	ErrUnannouncedSourceEpoch = errors.New("producer: source epoch advanced without a reset or replacement")
	// ErrEpochOutOfRange: a reset or replacement announced a source epoch
	// above [MaxSourceEpoch]; nothing changed.
	ErrEpochOutOfRange = errors.New("producer: source epoch out of range")
	// ErrLagged closes a [Subscription] whose bounded delta buffer overflowed;
	// the consumer must subscribe again with a new lease. Nothing is skipped
	// silently.
	ErrLagged = errors.New("producer: subscriber lagged")
	// ErrSuperseded closes a [Subscription] when a later Subscribe installed
	// another lease; the old stream received its tail first.
	ErrSuperseded = errors.New("producer: subscription superseded")
)

// FenceReason says why a [Publisher] refuses to extend its stream. The zero
// value means not fenced.
type FenceReason uint8

// Fence reasons.
const (
	NotFenced FenceReason = iota
	FenceSequenceExhausted
	FenceDeliveryUncertain
	FenceLeaseStalled
)

func (r FenceReason) String() string {
	switch r {
	case NotFenced:
		return "NotFenced"
	case FenceSequenceExhausted:
		return "SequenceExhausted"
	case FenceDeliveryUncertain:
		return "DeliveryUncertain"
	case FenceLeaseStalled:
		return "LeaseStalled"
	}
	return fmt.Sprintf("FenceReason(%d)", r)
}

func (r FenceReason) sentinel() error {
	switch r {
	case FenceSequenceExhausted:
		return ErrSequenceExhausted
	case FenceDeliveryUncertain:
		return ErrDeliveryUncertain
	case FenceLeaseStalled:
		return ErrLeaseStalled
	}
	return nil
}

// PublishError reports a publication the publisher refused or could not
// deliver. errors.Is matches [ErrPublisherFenced], the sentinel of Reason and,
// when Cause is set, the sink's error.
type PublishError struct {
	// Reason is the fence the publisher is under after the call.
	Reason FenceReason
	// LastSequence is the publisher's last sequence (not advanced).
	LastSequence uint64
	// Cause is the sink's error when this call's enqueue failed; nil when the
	// publisher was already fenced or the sequence would overflow.
	Cause error
}

func (e *PublishError) Error() string {
	s := fmt.Sprintf("producer: publisher fenced (%v) at sequence %d", e.Reason, e.LastSequence)
	if e.Cause != nil {
		s += ": " + e.Cause.Error()
	}
	return s
}

// Unwrap returns ErrPublisherFenced, the reason's sentinel and the cause.
func (e *PublishError) Unwrap() []error {
	errs := []error{ErrPublisherFenced}
	if s := e.Reason.sentinel(); s != nil {
		errs = append(errs, s)
	}
	if e.Cause != nil {
		errs = append(errs, e.Cause)
	}
	return errs
}

// StaleSourceEpochError reports a replacement or reset carrying a source
// epoch older than the one the actor holds for the member. Nothing changed.
type StaleSourceEpochError struct {
	Member   ckf.Member
	Current  uint64
	Received uint64
}

func (e *StaleSourceEpochError) Error() string {
	return fmt.Sprintf("producer: stale source epoch for worker %d rank %d: current %d, received %d",
		e.Member.WorkerID, e.Member.DPRank, e.Current, e.Received)
}

// Unwrap returns ErrStaleSourceEpoch.
func (e *StaleSourceEpochError) Unwrap() error { return ErrStaleSourceEpoch }

// stoppedError is what work submitted after a stop returns: ErrShuttingDown,
// and also ErrFenced when the stop was a fence.
type stoppedError struct{ fenced bool }

func (e stoppedError) Error() string {
	if e.fenced {
		return "producer: fenced: shutting down"
	}
	return ErrShuttingDown.Error()
}

func (e stoppedError) Is(target error) bool {
	return target == ErrShuttingDown || (e.fenced && target == ErrFenced)
}

var (
	errStopped = stoppedError{}
	errFenced  = stoppedError{fenced: true}
)
