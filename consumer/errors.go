package consumer

import (
	"errors"
	"fmt"
)

// Manifest errors. Every [Manifest.Validate] failure is a [*ManifestError]
// that matches [ErrInvalidManifest] and the specific sentinel below.
var (
	// ErrInvalidManifest is the category of every manifest failure.
	ErrInvalidManifest = errors.New("consumer: invalid manifest")
	// ErrForeignDomain: a lane's pool belongs to another routing domain.
	ErrForeignDomain = errors.New("consumer: pool in another domain")
	// ErrDuplicatePool: two lanes name the same pool.
	ErrDuplicatePool = errors.New("consumer: duplicate pool")
	// ErrDuplicateDCID: two lanes name pools with the same dc_id.
	ErrDuplicateDCID = errors.New("consumer: duplicate dc_id")
	// ErrNoLanes: no lane is configured.
	ErrNoLanes = errors.New("consumer: no lane configured")
	// ErrInvalidWindow: the verification window is outside 1..=8.
	ErrInvalidWindow = errors.New("consumer: verification window outside 1..=8")
)

// Assignment and lane errors, returned by [Consumer.Assign], [Consumer.Retire]
// and [Consumer.LaneStatus] as a [*LaneError]. None of them changes any lane.
var (
	// ErrWrongConsumer: the lease names another consumer instance.
	ErrWrongConsumer = errors.New("consumer: lease for another consumer instance")
	// ErrWrongLane: the lane index is outside 0..15 or the lane is not configured.
	ErrWrongLane = errors.New("consumer: lane not configured")
	// ErrWrongPool: the producer identity names a pool other than the lane's.
	ErrWrongPool = errors.New("consumer: identity names another pool")
	// ErrFormatMismatch: the producer's format differs from the manifest's.
	ErrFormatMismatch = errors.New("consumer: format differs from manifest")
	// ErrStaleAssignmentEpoch: the lease epoch is not greater than the last
	// epoch ever assigned to the lane (retire keeps that epoch).
	ErrStaleAssignmentEpoch = errors.New("consumer: stale assignment epoch")
)

// Query errors.
var (
	// ErrUnavailable: no lane is ready, so no depth can be answered; or,
	// from AppendLaneWords, the lane asked for is not ready.
	ErrUnavailable = errors.New("consumer: no lane is ready")
	// ErrInvalidQuery: a query argument is unusable (block size ≤ 0, nil
	// result, an input over MaxInputBytes).
	ErrInvalidQuery = errors.New("consumer: invalid query")
)

// ManifestError is the detailed form of a manifest failure. Lane is the lane
// index involved, or -1 when the failure is not about one lane.
type ManifestError struct {
	Lane   int
	Err    error // one of the manifest sentinels, or a ckf.ErrInvalidFormat error
	Detail string
}

func (e *ManifestError) Error() string {
	s := ErrInvalidManifest.Error() + ": " + e.Err.Error()
	if e.Lane >= 0 {
		s += fmt.Sprintf(" (lane %d)", e.Lane)
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Unwrap returns the specific cause.
func (e *ManifestError) Unwrap() error { return e.Err }

// Is makes every ManifestError match [ErrInvalidManifest].
func (e *ManifestError) Is(target error) bool { return target == ErrInvalidManifest }

// LaneError is the detailed form of an assignment or lane-addressing error.
type LaneError struct {
	Op   string // "assign", "retire", "status", "words"
	Lane int
	Err  error // one of the sentinels above
}

func (e *LaneError) Error() string {
	return fmt.Sprintf("%v: %s lane %d", e.Err, e.Op, e.Lane)
}

// Unwrap returns the sentinel.
func (e *LaneError) Unwrap() error { return e.Err }
