package cbi1

import (
	"encoding/binary"
	"fmt"

	"github.com/zeebo/xxh3"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// AppendFrame appends the encoding of f to dst and returns the extended
// slice. It refuses (with an error wrapping [ErrInvalidFrame], dst
// unchanged) anything [Decode] would reject: an invalid format, an unknown
// kind, a chunk with ChunkCount 0, ChunkIndex >= ChunkCount, more than
// [MaxChunkBuckets] words or words past the table, a delta with more than
// [MaxDeltaImages] images (also [ErrDeltaTooLarge]) or a bucket index >=
// the bucket count. Images are written in the order given.
func AppendFrame(dst []byte, f *Frame) ([]byte, error) {
	if err := f.Format.Validate(); err != nil {
		return dst, encodeErr("%v", err)
	}
	switch f.Kind {
	case KindSnapshotChunk:
		if f.ChunkCount == 0 || f.ChunkIndex >= f.ChunkCount {
			return dst, encodeErr("chunk index %d of %d", f.ChunkIndex, f.ChunkCount)
		}
		if len(f.Words) > MaxChunkBuckets {
			return dst, encodeErr("chunk of %d words, more than %d", len(f.Words), MaxChunkBuckets)
		}
		if f.BucketOffset > f.Format.BucketCount || uint64(len(f.Words)) > f.Format.BucketCount-f.BucketOffset {
			return dst, encodeErr("words [%d, %d+%d) outside the %d-bucket table", f.BucketOffset, f.BucketOffset, len(f.Words), f.Format.BucketCount)
		}
	case KindDelta:
		if len(f.Images) > MaxDeltaImages {
			return dst, fmt.Errorf("%w: %w (%d images)", ErrInvalidFrame, ErrDeltaTooLarge, len(f.Images))
		}
		for i, im := range f.Images {
			if uint64(im.Bucket) >= f.Format.BucketCount {
				return dst, encodeErr("image %d: bucket %d outside the %d-bucket table", i, im.Bucket, f.Format.BucketCount)
			}
		}
	default:
		return dst, encodeErr("unknown kind %v", f.Kind)
	}

	start := len(dst)
	dst = appendHeader(dst, &f.Header)
	le := binary.LittleEndian
	switch f.Kind {
	case KindSnapshotChunk:
		dst = le.AppendUint32(dst, f.ChunkIndex)
		dst = le.AppendUint32(dst, f.ChunkCount)
		dst = le.AppendUint64(dst, f.BucketOffset)
		for _, w := range f.Words {
			dst = le.AppendUint64(dst, w)
		}
	case KindDelta:
		dst = le.AppendUint64(dst, f.BaseEpoch)
		dst = le.AppendUint32(dst, uint32(len(f.Images)))
		for _, im := range f.Images {
			dst = le.AppendUint32(dst, im.Bucket)
			dst = le.AppendUint64(dst, im.Word)
		}
	}
	frame := dst[start:]
	le.PutUint32(frame[offChecksum:], checksum(frame[HeaderLen:]))
	return dst, nil
}

// appendHeader writes the header with a zero checksum. The format must be
// valid.
func appendHeader(dst []byte, h *Header) []byte {
	le := binary.LittleEndian
	dst = append(dst, magic[:]...)
	dst = le.AppendUint16(dst, WireVersion)
	dst = le.AppendUint16(dst, uint16(h.Kind))
	dst = append(dst, h.Format.FingerprintBits, h.Format.SlotsPerBucket)
	dst = le.AppendUint16(dst, uint16(h.Format.Version))
	dst = le.AppendUint64(dst, h.Format.Seed)
	dst = le.AppendUint64(dst, h.Format.BucketCount)
	dst = le.AppendUint64(dst, h.DCID)
	dst = le.AppendUint64(dst, h.Epoch)
	return le.AppendUint32(dst, 0)
}

// checksum is the header's body_checksum: the low 32 bits of the body's
// XXH3-64 (seed 0).
func checksum(body []byte) uint32 { return uint32(xxh3.Hash(body)) }

// SnapshotChunks splits a whole table into snapshot-chunk frames of at most
// [MaxChunkBuckets] words each, in order: chunk i starts at bucket
// i·MaxChunkBuckets (Dynamo's split), so a table of n buckets gives
// ceil(n / MaxChunkBuckets) chunks (1 up to 512 Ki buckets, 32 at 2^24).
// len(words) must equal format.BucketCount. The frames' Words alias words.
func SnapshotChunks(format ckf.Format, dcID, epoch uint64, words []uint64) ([]Frame, error) {
	if err := format.Validate(); err != nil {
		return nil, encodeErr("%v", err)
	}
	if uint64(len(words)) != format.BucketCount {
		return nil, encodeErr("snapshot of %d words for a %d-bucket format", len(words), format.BucketCount)
	}
	count := (len(words) + MaxChunkBuckets - 1) / MaxChunkBuckets
	frames := make([]Frame, count)
	for i := range frames {
		lo := i * MaxChunkBuckets
		hi := min(lo+MaxChunkBuckets, len(words))
		frames[i] = Frame{
			Header:       Header{Kind: KindSnapshotChunk, Format: format, DCID: dcID, Epoch: epoch},
			ChunkIndex:   uint32(i),
			ChunkCount:   uint32(count),
			BucketOffset: uint64(lo),
			Words:        words[lo:hi:hi],
		}
	}
	return frames, nil
}

// EncodeSnapshot encodes a whole table at epoch as the frames of
// [SnapshotChunks], one byte slice per chunk.
func EncodeSnapshot(format ckf.Format, dcID, epoch uint64, words []uint64) ([][]byte, error) {
	frames, err := SnapshotChunks(format, dcID, epoch, words)
	if err != nil {
		return nil, err
	}
	out := make([][]byte, len(frames))
	for i := range frames {
		b, err := AppendFrame(make([]byte, 0, frames[i].Len()), &frames[i])
		if err != nil {
			return nil, err
		}
		out[i] = b
	}
	return out, nil
}

// EncodeDelta encodes one delta from baseEpoch to epoch. With more than
// [MaxDeltaImages] images it fails with [ErrDeltaTooLarge]: the caller then
// publishes the table as a snapshot at epoch instead ([EncodeSnapshot]).
func EncodeDelta(format ckf.Format, dcID, baseEpoch, epoch uint64, images []ckf.BucketImage) ([]byte, error) {
	f := Frame{
		Header:    Header{Kind: KindDelta, Format: format, DCID: dcID, Epoch: epoch},
		BaseEpoch: baseEpoch,
		Images:    images,
	}
	if len(images) > MaxDeltaImages {
		return AppendFrame(nil, &f) // reports ErrDeltaTooLarge before sizing anything
	}
	return AppendFrame(make([]byte, 0, f.Len()), &f)
}
