package wire

import (
	"fmt"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// Version is the wire version carried as the first element of every frame.
// It is exchanged between processes and must not change.
const Version = 1

// Kind is a frame kind. The numeric values are exchanged on the wire and must
// not change.
type Kind uint8

// Frame kinds (SPEC §9).
const (
	KindSnapshotChunk Kind = 1
	KindDelta         Kind = 2
	KindDrainMarker   Kind = 3
	KindHeartbeat     Kind = 4
	KindClose         Kind = 5
)

func (k Kind) String() string {
	switch k {
	case KindSnapshotChunk:
		return "snapshot_chunk"
	case KindDelta:
		return "delta"
	case KindDrainMarker:
		return "drain_marker"
	case KindHeartbeat:
		return "heartbeat"
	case KindClose:
		return "close"
	}
	return fmt.Sprintf("Kind(%d)", k)
}

// SnapshotChunk is one piece of a snapshot at Sequence. Chunks of one
// (lease, sequence) are ordered by ChunkIndex (0..ChunkCount-1), contiguous,
// and together cover every bucket exactly once; Words holds the buckets
// [BucketOffset, BucketOffset+len(Words)).
type SnapshotChunk struct {
	Identity     ckf.ProducerIdentity
	Lease        ckf.LaneLease
	Sequence     uint64
	ChunkIndex   uint32
	ChunkCount   uint32
	BucketOffset uint64
	Words        []uint64
}

// Heartbeat says the stream is alive at LastSequence without advancing it.
type Heartbeat struct {
	Identity     ckf.ProducerIdentity
	Lease        ckf.LaneLease
	LastSequence uint64
	UnixMicros   int64
}

// CloseReason says why a producer ended a stream. The strings are exchanged
// on the wire and must not change.
type CloseReason string

// Close reasons.
const (
	CloseShuttingDown    CloseReason = "shutting_down"
	CloseLagged          CloseReason = "lagged"
	CloseProducerChanged CloseReason = "producer_changed"
	CloseFenced          CloseReason = "fenced"
	CloseInvalidRequest  CloseReason = "invalid_request"
)

// Close ends a stream.
type Close struct {
	Reason  CloseReason
	Message string
}

// Frame is one frame: Kind selects which field is meaningful, the others are
// ignored by [AppendFrame] and left stale by [DecodeFrame]. A Frame may be
// reused across decodes: Snapshot.Words and Delta.Images are then refilled in
// place (see [DecodeFrame] for what aliases what). The zero Frame has no
// valid kind. A Frame is not safe for concurrent use.
type Frame struct {
	Kind      Kind
	Snapshot  SnapshotChunk   // KindSnapshotChunk
	Delta     ckf.Delta       // KindDelta
	Drain     ckf.DrainMarker // KindDrainMarker
	Heartbeat Heartbeat       // KindHeartbeat
	Close     Close           // KindClose

	raw []byte // payload bin of the last decoded snapshot chunk or delta; aliases the decoded input
}

// Payload returns the raw bin payload of the last snapshot chunk or delta
// decoded into f: little-endian u64 words (8 bytes each) for a snapshot
// chunk, {u32 LE bucket, u64 LE word} (12 bytes each) for a delta, nil for
// other kinds or a Frame that was not decoded. It aliases the byte slice
// passed to [DecodeFrame] or [DecodeFrameView] (or a [Reader]'s buffer,
// valid until its next read); copy it if it must outlive that.
func (f *Frame) Payload() []byte { return f.raw }

// Lease returns the lane lease f names: a snapshot chunk's, delta's,
// heartbeat's or drain marker's; ok is false for a close frame or an unknown
// kind, which name none.
func (f *Frame) Lease() (l ckf.LaneLease, ok bool) {
	switch f.Kind {
	case KindSnapshotChunk:
		return f.Snapshot.Lease, true
	case KindDelta:
		return f.Delta.Lease, true
	case KindHeartbeat:
		return f.Heartbeat.Lease, true
	case KindDrainMarker:
		return f.Drain.Lease, true
	}
	return l, false
}
