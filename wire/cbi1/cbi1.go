package cbi1

import (
	"fmt"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// Sizes and limits of CBI1 (docs/wire.md §8). They are exchanged with
// Dynamo and must not change.
const (
	// HeaderLen is the length of the header every frame starts with.
	HeaderLen = 48
	// WireVersion is the only CBI1 wire version.
	WireVersion uint16 = 1
	// MaxChunkBuckets is the most bucket words one snapshot chunk holds
	// (512 Ki buckets, 4 MiB of words).
	MaxChunkBuckets = 512 * 1024
	// MaxFrameBytes is the largest frame: a full snapshot chunk
	// (header, 16-byte chunk prefix, MaxChunkBuckets words) = 4,194,368 bytes.
	MaxFrameBytes = HeaderLen + chunkPrefixLen + MaxChunkBuckets*8
	// MaxDeltaImages is the most images a delta holds so that it fits
	// MaxFrameBytes: floor((4,194,368 − 48 − 12) / 12) = 349,525. A
	// publication with more images is sent as a snapshot.
	MaxDeltaImages = (MaxFrameBytes - HeaderLen - deltaPrefixLen) / imageLen
)

const (
	chunkPrefixLen = 16 // chunk_index u32, chunk_count u32, bucket_offset u64
	deltaPrefixLen = 12 // base_epoch u64, image_count u32
	imageLen       = 12 // bucket u32, word u64

	// Header field offsets.
	offMagic         = 0
	offWireVersion   = 4
	offFlags         = 6
	offFingerprint   = 8
	offSlots         = 9
	offFormatVersion = 10
	offSeed          = 12
	offBucketCount   = 20
	offDCID          = 28
	offEpoch         = 36
	offChecksum      = 44
)

// magic is the first four bytes of every frame.
var magic = [4]byte{'C', 'B', 'I', '1'}

// Kind is the header's flags field: which body follows. Its values are
// exchanged with Dynamo and must not change.
type Kind uint16

// Frame kinds.
const (
	KindSnapshotChunk Kind = 1
	KindDelta         Kind = 2
)

func (k Kind) String() string {
	switch k {
	case KindSnapshotChunk:
		return "snapshot_chunk"
	case KindDelta:
		return "delta"
	}
	return fmt.Sprintf("Kind(%#04x)", uint16(k))
}

// Header is what the 48-byte header says, apart from the constants (magic,
// wire version) and the checksum, which the encoder computes.
//
// Epoch is the publication sequence: a delta's sequence, or the sequence of
// the snapshot a chunk belongs to (Dynamo's FilterUpdate.sequence). DCID is
// the producer's data center (ProducerIdentity.pool_id.dc_id); a consumer
// checks it against the identity it subscribed to.
type Header struct {
	Kind   Kind
	Format ckf.Format
	DCID   uint64
	Epoch  uint64
}

// CheckFormat reports, as an [*Error] wrapping [ErrFormat], whether the
// header's format differs from want (the format of the producer identity
// the stream was opened for). A decoded frame's format is always valid.
func (h *Header) CheckFormat(want ckf.Format) error {
	if h.Format != want {
		return decodeErr(ErrFormat, offFormatVersion, "format", "frame carries %+v, expected %+v", h.Format, want)
	}
	return nil
}

// Frame is one CBI1 frame: the header and, by Kind, a snapshot chunk or a
// delta body; the fields of the other kind are ignored by [AppendFrame] and
// left stale by [Decode]. A Frame may be reused across decodes: Words and
// Images are then refilled in place. The zero Frame has no valid kind. A
// Frame is not safe for concurrent use.
type Frame struct {
	Header

	// KindSnapshotChunk: chunk ChunkIndex of ChunkCount, holding the buckets
	// [BucketOffset, BucketOffset+len(Words)).
	ChunkIndex   uint32
	ChunkCount   uint32
	BucketOffset uint64
	Words        []uint64

	// KindDelta: absolute images taking a table from BaseEpoch to Epoch
	// (Dynamo's FilterUpdate.base_sequence).
	BaseEpoch uint64
	Images    []ckf.BucketImage
}

// Len returns the encoded length of f, or 0 for an unknown kind.
func (f *Frame) Len() int {
	switch f.Kind {
	case KindSnapshotChunk:
		return HeaderLen + chunkPrefixLen + 8*len(f.Words)
	case KindDelta:
		return HeaderLen + deltaPrefixLen + imageLen*len(f.Images)
	}
	return 0
}
