package cbi1

import (
	"encoding/binary"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// Decode decodes one frame (a whole FilterUpdate.payload) into f. On
// success f's header and the body fields of its kind are set; Words or
// Images are refilled in place, growing only to the frame's own count, and
// never alias b. On failure it returns an [*Error] and leaves f unchanged.
//
// Checks, in order (the first failure is reported): length in
// [HeaderLen, MaxFrameBytes]; magic; wire version; checksum; format
// version, fingerprint bits, slots per bucket, bucket count (a power of two
// in 2..=2^24); with [DecodeFor], the expected format; flags; then the body:
//
//   - snapshot chunk: at least the 16-byte prefix; chunk_count ≥ 1 and
//     chunk_index < chunk_count; the words a multiple of 8 bytes, at most
//     MaxChunkBuckets of them, and bucket_offset + words ≤ bucket_count;
//   - delta: at least the 12-byte prefix; image_count ≤ MaxDeltaImages; the
//     body exactly 12 + 12·image_count bytes; every bucket < bucket_count.
//
// An empty chunk (no words) and an empty delta are valid frames.
//
// Decode checks that the format is one CBI1 allows, not that it is the
// format a stream expects; a consumer that knows it (the producer key it
// subscribed under) decodes with [DecodeFor], which checks it in Dynamo's
// place, before the flags and the body.
func Decode(b []byte, f *Frame) error { return decode(b, nil, f) }

// DecodeFor is [Decode] for a consumer that expects the format want: a frame
// whose valid format differs from want (another seed or bucket count) is
// refused with [ErrFormat] right after the format's own checks, before the
// flags and the body are looked at. This is the order of Dynamo's decoder,
// which takes the expected format as an argument
// (lib/llm/src/kv_dc_relay/publication/cbi1.rs @3e611dbc, decode →
// FilterFormat::validate, then the flags): the same bad frame gets the same
// error class from both (a mismatched frame with unknown flags is a format
// error, not a flags error). Decode followed by [Header.CheckFormat] would
// report the flags or the body first.
func DecodeFor(b []byte, want ckf.Format, f *Frame) error { return decode(b, &want, f) }

func decode(b []byte, want *ckf.Format, f *Frame) error {
	if len(b) < HeaderLen {
		return decodeErr(ErrTruncated, 0, "", "%d bytes, the header is %d", len(b), HeaderLen)
	}
	if len(b) > MaxFrameBytes {
		return decodeErr(ErrFrameTooLarge, 0, "", "%d bytes, at most %d", len(b), MaxFrameBytes)
	}
	if [4]byte(b[offMagic:]) != magic {
		return decodeErr(ErrMagic, offMagic, "magic", "%q", b[offMagic:offMagic+4])
	}
	le := binary.LittleEndian
	if v := le.Uint16(b[offWireVersion:]); v != WireVersion {
		return decodeErr(ErrWireVersion, offWireVersion, "wire_version", "%d", v)
	}
	body := b[HeaderLen:]
	if got, want := le.Uint32(b[offChecksum:]), checksum(body); got != want {
		return decodeErr(ErrChecksum, offChecksum, "body_checksum", "header %#08x, body %#08x", got, want)
	}
	h := Header{
		Kind:  Kind(le.Uint16(b[offFlags:])),
		DCID:  le.Uint64(b[offDCID:]),
		Epoch: le.Uint64(b[offEpoch:]),
	}
	if v := le.Uint16(b[offFormatVersion:]); v != uint16(ckf.FormatVersion) {
		return decodeErr(ErrFormat, offFormatVersion, "format_version", "%d, expected %d", v, ckf.FormatVersion)
	}
	h.Format = ckf.NewFormat(le.Uint64(b[offSeed:]), le.Uint64(b[offBucketCount:]))
	h.Format.FingerprintBits = b[offFingerprint]
	h.Format.SlotsPerBucket = b[offSlots]
	if err := h.Format.Validate(); err != nil {
		off, field := offBucketCount, "bucket_count"
		switch {
		case h.Format.FingerprintBits != ckf.FingerprintBits:
			off, field = offFingerprint, "fingerprint_bits"
		case h.Format.SlotsPerBucket != ckf.SlotsPerBucket:
			off, field = offSlots, "slots_per_bucket"
		}
		return decodeErr(ErrFormat, off, field, "%v", err)
	}
	if want != nil {
		if err := h.CheckFormat(*want); err != nil {
			return err
		}
	}
	switch h.Kind {
	case KindSnapshotChunk:
		return decodeChunk(&h, body, f)
	case KindDelta:
		return decodeDelta(&h, body, f)
	}
	return decodeErr(ErrFlags, offFlags, "flags", "%#04x", uint16(h.Kind))
}

func decodeChunk(h *Header, body []byte, f *Frame) error {
	le := binary.LittleEndian
	if len(body) < chunkPrefixLen {
		return decodeErr(ErrMalformed, HeaderLen, "chunk", "body of %d bytes, the chunk prefix is %d", len(body), chunkPrefixLen)
	}
	index, count := le.Uint32(body[0:]), le.Uint32(body[4:])
	if count == 0 || index >= count {
		return decodeErr(ErrMalformed, HeaderLen, "chunk_index", "chunk %d of %d", index, count)
	}
	offset := le.Uint64(body[8:])
	raw := body[chunkPrefixLen:]
	if len(raw)%8 != 0 {
		return decodeErr(ErrMalformed, HeaderLen+chunkPrefixLen, "words", "%d bytes, not a multiple of 8", len(raw))
	}
	n := len(raw) / 8
	if n > MaxChunkBuckets {
		return decodeErr(ErrLimitExceeded, HeaderLen+chunkPrefixLen, "words", "%d words, at most %d", n, MaxChunkBuckets)
	}
	if offset > h.Format.BucketCount || uint64(n) > h.Format.BucketCount-offset {
		return decodeErr(ErrMalformed, HeaderLen+8, "bucket_offset", "words [%d, %d+%d) outside the %d-bucket table", offset, offset, n, h.Format.BucketCount)
	}
	words := f.Words[:0]
	for i := 0; i < len(raw); i += 8 {
		words = append(words, le.Uint64(raw[i:]))
	}
	f.Header, f.ChunkIndex, f.ChunkCount, f.BucketOffset, f.Words = *h, index, count, offset, words
	return nil
}

func decodeDelta(h *Header, body []byte, f *Frame) error {
	le := binary.LittleEndian
	if len(body) < deltaPrefixLen {
		return decodeErr(ErrMalformed, HeaderLen, "delta", "body of %d bytes, the delta prefix is %d", len(body), deltaPrefixLen)
	}
	base, count := le.Uint64(body[0:]), le.Uint32(body[8:])
	if count > MaxDeltaImages {
		return decodeErr(ErrLimitExceeded, HeaderLen+8, "image_count", "%d images, at most %d", count, MaxDeltaImages)
	}
	// count ≤ MaxDeltaImages, so the product cannot overflow an int.
	if want := deltaPrefixLen + imageLen*int(count); len(body) != want {
		return decodeErr(ErrMalformed, HeaderLen+8, "image_count", "%d images need a %d-byte body, have %d", count, want, len(body))
	}
	raw := body[deltaPrefixLen:]
	for i := 0; i < len(raw); i += imageLen {
		if bucket := le.Uint32(raw[i:]); uint64(bucket) >= h.Format.BucketCount {
			return decodeErr(ErrMalformed, HeaderLen+deltaPrefixLen+i, "bucket", "image %d: bucket %d outside the %d-bucket table", i/imageLen, bucket, h.Format.BucketCount)
		}
	}
	images := f.Images[:0]
	for i := 0; i < len(raw); i += imageLen {
		images = append(images, ckf.BucketImage{Bucket: le.Uint32(raw[i:]), Word: le.Uint64(raw[i+4:])})
	}
	f.Header, f.BaseEpoch, f.Images = *h, base, images
	return nil
}
