package consumer

import (
	"fmt"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// Outcome is what applying one frame did to its lane. Every rule of SPEC §8.3
// ends in exactly one outcome; together with [Fault] it tells the host what to
// do next. The numeric values cross the WebAssembly ABI and must not change.
type Outcome uint8

// Outcomes.
const (
	// Applied: a delta's images were written; the installed sequence advanced.
	Applied Outcome = iota + 1
	// SnapshotInstalled: a snapshot (or its last chunk) was written and the
	// lane became ready at the snapshot's sequence.
	SnapshotInstalled
	// SnapshotChunkAccepted: a non-final chunk was staged; the lane stays not
	// ready and queries cannot see its words yet.
	SnapshotChunkAccepted
	// IgnoredForeignLease: the frame's lease is not the lane's current lease
	// (none assigned, superseded, another consumer, no such lane). No change.
	IgnoredForeignLease
	// IgnoredStaleOrDuplicate: the frame is at or behind the installed
	// sequence of a ready lane. No change.
	IgnoredStaleOrDuplicate
	// AwaitingSnapshot: a delta reached an assigned lane that has no snapshot
	// yet. No change.
	AwaitingSnapshot
	// DrainAcknowledged: the drain marker's sequence equals the installed one.
	DrainAcknowledged
	// Deactivated: the lane faulted (see [Fault]); it is no longer ready and
	// its lease is revoked. The host must assign a new epoch and snapshot.
	// Maps to ckf.ConsumerGapOrMalformedBeforeWrite → DeactivateAndSnapshot.
	Deactivated
	// RetrySnapshot: a snapshot install failed on a lane that was not ready
	// (see [Fault]); the partial snapshot is discarded and the lease stays
	// valid, so the producer may resend a snapshot on the same lease.
	// Maps to ckf.InactiveSnapshotInstallFailure → RetrySnapshot.
	RetrySnapshot
	// HeartbeatObserved: a heartbeat under the current lease was recorded in
	// the lane's stats. Sequences are not advanced.
	HeartbeatObserved
	// StreamClosed: a close frame. It names no lease, so no lane changes; the
	// host that owns the stream decides (retire, resubscribe).
	StreamClosed
	// IgnoredUnknownKind: a frame of a kind this consumer does not know. No change.
	IgnoredUnknownKind
)

var outcomeNames = [...]string{
	Applied:                 "Applied",
	SnapshotInstalled:       "SnapshotInstalled",
	SnapshotChunkAccepted:   "SnapshotChunkAccepted",
	IgnoredForeignLease:     "IgnoredForeignLease",
	IgnoredStaleOrDuplicate: "IgnoredStaleOrDuplicate",
	AwaitingSnapshot:        "AwaitingSnapshot",
	DrainAcknowledged:       "DrainAcknowledged",
	Deactivated:             "Deactivated",
	RetrySnapshot:           "RetrySnapshot",
	HeartbeatObserved:       "HeartbeatObserved",
	StreamClosed:            "StreamClosed",
	IgnoredUnknownKind:      "IgnoredUnknownKind",
}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) && outcomeNames[o] != "" {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", o)
}

// Ignored reports whether the outcome left every lane exactly as it was.
func (o Outcome) Ignored() bool {
	switch o {
	case IgnoredForeignLease, IgnoredStaleOrDuplicate, AwaitingSnapshot, StreamClosed, IgnoredUnknownKind:
		return true
	}
	return false
}

// Fault says why a lane was [Deactivated] or asked to [RetrySnapshot]. The
// numeric values cross the WebAssembly ABI and must not change.
type Fault uint8

// Faults, in the order SPEC §8.3 checks them.
const (
	NoFault Fault = iota
	// WrongIdentity: the frame's producer identity differs from the assigned one.
	WrongIdentity
	// WrongBucketCount: a snapshot does not hold exactly bucket_count words
	// (a chunk reaches past the table or the last chunk ends short of it).
	WrongBucketCount
	// SnapshotWhileReady: a newer snapshot reached a ready lane.
	SnapshotWhileReady
	// BaseSequenceMismatch: a delta's base is not the installed sequence (a gap).
	BaseSequenceMismatch
	// SequenceOverflow: base+1 overflows uint64.
	SequenceOverflow
	// NonContiguous: a delta's sequence is not base+1.
	NonContiguous
	// MalformedImages: an image names a bucket ≥ bucket_count, or two images
	// name the same bucket.
	MalformedImages
	// EmptyDelta: a delta carries no image.
	EmptyDelta
	// TerminalSequenceMismatch: a drain marker's expected sequence is not the
	// installed one (the final delta was lost), or the lane is not ready.
	TerminalSequenceMismatch
	// ChunkOutOfOrder: a chunk is not the next one of the partial snapshot
	// (wrong index, wrong count, or a first chunk that is not chunk 0).
	ChunkOutOfOrder
	// ChunkOverlap: a chunk's bucket offset is not where the previous chunk
	// ended (overlapping or leaving a hole).
	ChunkOverlap
	// ChunkSequenceMismatch: a chunk belongs to another snapshot sequence than
	// the partial one.
	ChunkSequenceMismatch
	// DeltaDuringSnapshot: a delta arrived before the last chunk.
	DeltaDuringSnapshot
	// MalformedChunk: a chunk count of 0, an index ≥ count, or an empty chunk.
	MalformedChunk
	// HeartbeatSequenceMismatch: a heartbeat on a ready lane reports a last
	// sequence other than the installed one (a delta was lost on an idle
	// stream; see docs/RATIONALE.md).
	HeartbeatSequenceMismatch
)

var faultNames = [...]string{
	NoFault:                   "NoFault",
	WrongIdentity:             "WrongIdentity",
	WrongBucketCount:          "WrongBucketCount",
	SnapshotWhileReady:        "SnapshotWhileReady",
	BaseSequenceMismatch:      "BaseSequenceMismatch",
	SequenceOverflow:          "SequenceOverflow",
	NonContiguous:             "NonContiguous",
	MalformedImages:           "MalformedImages",
	EmptyDelta:                "EmptyDelta",
	TerminalSequenceMismatch:  "TerminalSequenceMismatch",
	ChunkOutOfOrder:           "ChunkOutOfOrder",
	ChunkOverlap:              "ChunkOverlap",
	ChunkSequenceMismatch:     "ChunkSequenceMismatch",
	DeltaDuringSnapshot:       "DeltaDuringSnapshot",
	MalformedChunk:            "MalformedChunk",
	HeartbeatSequenceMismatch: "HeartbeatSequenceMismatch",
}

func (f Fault) String() string {
	if int(f) < len(faultNames) && faultNames[f] != "" {
		return faultNames[f]
	}
	return fmt.Sprintf("Fault(%d)", f)
}

// Result reports one applied frame. It is a small value; producing it never
// allocates.
type Result struct {
	Outcome Outcome
	// Fault is set for Deactivated and RetrySnapshot, NoFault otherwise.
	Fault Fault
	// Lane is the lane the frame addressed, or -1 when it named none that
	// exists (a lane index ≥ 16, or a close frame).
	Lane int
	// Sequence is the lane's installed sequence after the frame (0 when the
	// lane is not ready).
	Sequence uint64
}

func (r Result) String() string {
	if r.Fault != NoFault {
		return fmt.Sprintf("lane %d: %v(%v)", r.Lane, r.Outcome, r.Fault)
	}
	return fmt.Sprintf("lane %d: %v @%d", r.Lane, r.Outcome, r.Sequence)
}

// FailurePoint maps the result to SPEC §5: Deactivated →
// ConsumerGapOrMalformedBeforeWrite (every check runs before any write, so
// the lane's commit is known unchanged), RetrySnapshot →
// InactiveSnapshotInstallFailure; 0 for every non-fault outcome.
func (r Result) FailurePoint() ckf.FailurePoint {
	switch r.Outcome {
	case Deactivated:
		return ckf.ConsumerGapOrMalformedBeforeWrite
	case RetrySnapshot:
		return ckf.InactiveSnapshotInstallFailure
	}
	return 0
}

// Disposition returns the SPEC §5 row of the result's failure point; ok is
// false when the outcome is not a fault.
func (r Result) Disposition() (d ckf.Disposition, ok bool) {
	return ckf.DispositionOf(r.FailurePoint())
}
