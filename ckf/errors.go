package ckf

import (
	"errors"
	"fmt"
)

// Configuration and format errors.
var (
	// ErrInvalidConfig is wrapped by every [Config.Validate] and [BucketCount] failure.
	ErrInvalidConfig = errors.New("ckf: invalid config")
	// ErrInvalidFormat is wrapped by every [Format.Validate] failure.
	ErrInvalidFormat = errors.New("ckf: invalid format")
)

// Event errors of SPEC §5. Callers branch on them with errors.Is; the
// [*EventError] that wraps one carries the member and block involved.
var (
	// ErrParentBlockNotFound: a Stored event names a parent the member never stored.
	ErrParentBlockNotFound = errors.New("ckf: parent block not found")
	// ErrBlockNotFound: an operation names a block the member does not hold.
	ErrBlockNotFound = errors.New("ckf: block not found")
	// ErrInvalidBlockSequence: a Stored event cannot be canonicalized
	// (root with start_position > 0, an external hash remapped to another
	// canonical hash, or a duplicate external hash within one event).
	ErrInvalidBlockSequence = errors.New("ckf: invalid block sequence")
	// ErrCapacityExhausted: a bounded relocation chain failed; the filter is
	// unchanged and the block is tracked as non-resident (capacity omission).
	ErrCapacityExhausted = errors.New("ckf: capacity exhausted")
	// ErrAllocationFailed: memory for new exact state could not be reserved.
	ErrAllocationFailed = errors.New("ckf: allocation failed")
	// ErrMemberLimit: a Stored event of a member holding nothing would take
	// the pool past [Config.MaxMembers]; nothing committed. It matches
	// [ErrAllocationFailed]: a configured bound refused the new exact state.
	ErrMemberLimit = fmt.Errorf("%w: max_members reached", ErrAllocationFailed)
	// ErrTrackedBlockLimit: a Stored event would take the pool's tracked
	// blocks (lineage entries over all members) past
	// [Config.MaxTrackedBlocks]; nothing committed. It matches
	// [ErrAllocationFailed].
	ErrTrackedBlockLimit = fmt.Errorf("%w: max_tracked_blocks reached", ErrAllocationFailed)
	// ErrOwnershipDegreeOverflow: a canonical block's owner count would overflow.
	ErrOwnershipDegreeOverflow = errors.New("ckf: ownership degree overflow")
	// ErrIndexerInvariantViolation: exact state and filter disagree (a resident
	// block's fingerprint is missing from both candidate buckets).
	ErrIndexerInvariantViolation = errors.New("ckf: indexer invariant violation")
	// ErrUnsupportedResidencyDomain: an event names a storage tier the pool
	// cannot represent. (A replacement holding a non-Stored or non-device
	// event fails with [ErrInvalidReplacement] instead.)
	ErrUnsupportedResidencyDomain = errors.New("ckf: unsupported residency domain")
)

// ErrMalformedEvent: an event has an unknown kind or is otherwise unusable.
var ErrMalformedEvent = errors.New("ckf: malformed event")

// ErrInvalidReplacement: a rank replacement names a member twice, or holds an
// event of another member, a non-Stored event or a non-device event.
var ErrInvalidReplacement = errors.New("ckf: invalid rank replacement")

// EventError is the detailed form of an event error. Kind is one of the
// sentinels above; errors.Is(err, Kind) holds.
type EventError struct {
	Kind      error  // one of the Err* sentinels
	Member    Member // the member the event came from
	BlockHash uint64 // the external (or canonical, for capacity) hash involved; 0 if none
	Detail    string // a short human-readable explanation, may be empty
}

func (e *EventError) Error() string {
	s := fmt.Sprintf("%v: worker %d rank %d block %#x", e.Kind, e.Member.WorkerID, e.Member.DPRank, e.BlockHash)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Unwrap returns the sentinel kind.
func (e *EventError) Unwrap() error { return e.Kind }

func configError(msg string) error { return fmt.Errorf("%w: %s", ErrInvalidConfig, msg) }
func formatError(msg string) error { return fmt.Errorf("%w: %s", ErrInvalidFormat, msg) }

// FailurePoint names where a failure happened (SPEC §5).
type FailurePoint uint8

// Failure points. Their String forms are logged and must not change.
const (
	BoundedRelocationFailure FailurePoint = iota + 1
	PrecommitAllocationFailure
	SourceProtocolFailure
	PrewriteInvariantMismatch
	ConsumerGapOrMalformedBeforeWrite
	ConsumerWorkerFailureMidApply
	InactiveSnapshotInstallFailure
)

var failurePointNames = [...]string{
	BoundedRelocationFailure:          "BoundedRelocationFailure",
	PrecommitAllocationFailure:        "PrecommitAllocationFailure",
	SourceProtocolFailure:             "SourceProtocolFailure",
	PrewriteInvariantMismatch:         "PrewriteInvariantMismatch",
	ConsumerGapOrMalformedBeforeWrite: "ConsumerGapOrMalformedBeforeWrite",
	ConsumerWorkerFailureMidApply:     "ConsumerWorkerFailureMidApply",
	InactiveSnapshotInstallFailure:    "InactiveSnapshotInstallFailure",
}

func (p FailurePoint) String() string {
	if int(p) < len(failurePointNames) && failurePointNames[p] != "" {
		return failurePointNames[p]
	}
	return fmt.Sprintf("FailurePoint(%d)", p)
}

// FailurePointOf maps an event error to its failure point:
// CapacityExhausted → BoundedRelocationFailure, AllocationFailed →
// PrecommitAllocationFailure, IndexerInvariantViolation →
// PrewriteInvariantMismatch, anything else → SourceProtocolFailure.
// It returns 0 for a nil error.
func FailurePointOf(err error) FailurePoint {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrCapacityExhausted):
		return BoundedRelocationFailure
	case errors.Is(err, ErrAllocationFailed):
		return PrecommitAllocationFailure
	case errors.Is(err, ErrIndexerInvariantViolation):
		return PrewriteInvariantMismatch
	default:
		return SourceProtocolFailure
	}
}

// FailureDomain is the component a failure happened in.
type FailureDomain uint8

// Failure domains.
const (
	ProducerCore FailureDomain = iota + 1
	ConsumerLane
)

func (d FailureDomain) String() string {
	switch d {
	case ProducerCore:
		return "ProducerCore"
	case ConsumerLane:
		return "ConsumerLane"
	}
	return fmt.Sprintf("FailureDomain(%d)", d)
}

// CommitState says whether the failed operation's effect is known.
type CommitState uint8

// Commit states.
const (
	KnownUnchanged CommitState = iota + 1
	Uncertain
)

func (c CommitState) String() string {
	switch c {
	case KnownUnchanged:
		return "KnownUnchanged"
	case Uncertain:
		return "Uncertain"
	}
	return fmt.Sprintf("CommitState(%d)", c)
}

// RecoveryAction is what the owner of the failed state must do.
type RecoveryAction uint8

// Recovery actions.
const (
	ContinueCapacityOmission RecoveryAction = iota + 1
	ReportResourceFailure
	RejectSource
	FenceAndRebuildProducer
	DeactivateAndSnapshot
	RetrySnapshot
)

var recoveryActionNames = [...]string{
	ContinueCapacityOmission: "ContinueCapacityOmission",
	ReportResourceFailure:    "ReportResourceFailure",
	RejectSource:             "RejectSource",
	FenceAndRebuildProducer:  "FenceAndRebuildProducer",
	DeactivateAndSnapshot:    "DeactivateAndSnapshot",
	RetrySnapshot:            "RetrySnapshot",
}

func (a RecoveryAction) String() string {
	if int(a) < len(recoveryActionNames) && recoveryActionNames[a] != "" {
		return recoveryActionNames[a]
	}
	return fmt.Sprintf("RecoveryAction(%d)", a)
}

// Disposition is one row of the SPEC §5 table. RecoveryDomain is 0 where the
// table has "—" (nothing needs recovery).
type Disposition struct {
	Domain         FailureDomain
	Commit         CommitState
	RecoveryDomain FailureDomain
	Action         RecoveryAction
}

// DispositionOf returns the disposition of a failure point. Recovery targets
// the state whose commit became uncertain, never merely the error's name; a
// capacity omission never faults and never retires a consumer lane. ok is
// false for an unknown point.
func DispositionOf(p FailurePoint) (d Disposition, ok bool) {
	switch p {
	case BoundedRelocationFailure:
		return Disposition{ProducerCore, KnownUnchanged, 0, ContinueCapacityOmission}, true
	case PrecommitAllocationFailure:
		return Disposition{ProducerCore, KnownUnchanged, 0, ReportResourceFailure}, true
	case SourceProtocolFailure:
		return Disposition{ProducerCore, KnownUnchanged, 0, RejectSource}, true
	case PrewriteInvariantMismatch:
		return Disposition{ProducerCore, KnownUnchanged, ProducerCore, FenceAndRebuildProducer}, true
	case ConsumerGapOrMalformedBeforeWrite:
		return Disposition{ConsumerLane, KnownUnchanged, ConsumerLane, DeactivateAndSnapshot}, true
	case ConsumerWorkerFailureMidApply:
		return Disposition{ConsumerLane, Uncertain, ConsumerLane, DeactivateAndSnapshot}, true
	case InactiveSnapshotInstallFailure:
		return Disposition{ConsumerLane, KnownUnchanged, ConsumerLane, RetrySnapshot}, true
	}
	return Disposition{}, false
}
