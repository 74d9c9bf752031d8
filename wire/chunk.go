package wire

import (
	"math"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// MaxSnapshotChunkOverhead is the largest encoded size of a snapshot chunk
// frame minus its words: every field at its widest msgpack integer encoding
// and a bin32 header. A chunk of n words therefore encodes to at most
// MaxSnapshotChunkOverhead + 8n bytes (excluding the stream's length prefix).
const MaxSnapshotChunkOverhead = 149

// ChunkWords returns how many bucket words one snapshot chunk may carry so
// that its frame fits maxFrameBytes (≤ 0 means [DefaultMaxFrameBytes]),
// whatever the identity, lease and sequence values: the default 8 MiB limit
// gives 1,048,557 words per chunk, so a 524,288-bucket table is one chunk and
// a 2^24-bucket table is 17. It fails with [ErrInvalidFrame] when the limit
// cannot hold even one word.
func ChunkWords(maxFrameBytes int) (int, error) {
	limit := clampLimit(maxFrameBytes)
	n := (limit - MaxSnapshotChunkOverhead) / 8
	if n < 1 {
		return 0, encodeError("frame limit %d bytes cannot hold one snapshot word", limit)
	}
	return n, nil
}

// SplitSnapshot splits s into the chunk frames of one chunked snapshot, each
// fitting maxFrameBytes (≤ 0 means [DefaultMaxFrameBytes]): chunk i carries
// the buckets [i*w, min((i+1)*w, len(s.Words))) where w = ChunkWords(limit),
// so chunks are ordered, contiguous and cover every bucket exactly once, and
// every chunk carries at least one word (SPEC §9): a snapshot with no words
// fails with [ErrInvalidFrame] (no valid table has fewer than 2 buckets).
//
// The chunks' Words alias s.Words; nothing is copied. Encode them before
// s.Words changes.
func SplitSnapshot(s *ckf.Snapshot, maxFrameBytes int) ([]SnapshotChunk, error) {
	per, err := ChunkWords(maxFrameBytes)
	if err != nil {
		return nil, err
	}
	n := len(s.Words)
	if n == 0 {
		return nil, encodeError("a snapshot with no words has no chunks: every chunk carries at least one word")
	}
	count := (n + per - 1) / per
	if uint64(count) > math.MaxUint32 {
		return nil, encodeError("%d chunks exceed a uint32 count", count)
	}
	chunks := make([]SnapshotChunk, count)
	for i := range chunks {
		lo := i * per
		hi := min(lo+per, n)
		chunks[i] = SnapshotChunk{
			Identity:     s.Identity,
			Lease:        s.Lease,
			Sequence:     s.Sequence,
			ChunkIndex:   uint32(i),
			ChunkCount:   uint32(count),
			BucketOffset: uint64(lo),
			Words:        s.Words[lo:hi:hi],
		}
	}
	return chunks, nil
}

// WriteSnapshot writes s as the chunk frames [SplitSnapshot] produces for the
// writer's limit, in order. On an error some chunks may have been written;
// a consumer discards a partial snapshot (SPEC §8.3), so the caller
// re-snapshots or closes the stream.
func (w *Writer) WriteSnapshot(s *ckf.Snapshot) error {
	chunks, err := SplitSnapshot(s, w.limit)
	if err != nil {
		return err
	}
	var f Frame
	f.Kind = KindSnapshotChunk
	for i := range chunks {
		f.Snapshot = chunks[i]
		if err := w.WriteFrame(&f); err != nil {
			return err
		}
	}
	return nil
}
