package cbi1_test

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/zeebo/xxh3"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire/cbi1"
)

// reseal rewrites the body checksum, so a test can change the body and
// still reach the checks after the checksum.
func reseal(b []byte) []byte {
	binary.LittleEndian.PutUint32(b[44:], uint32(xxh3.Hash(b[48:])))
	return b
}

func mutate(t *testing.T, base []byte, f func(b []byte) []byte) []byte {
	t.Helper()
	return f(append([]byte(nil), base...))
}

func put16(b []byte, at int, v uint16) []byte { binary.LittleEndian.PutUint16(b[at:], v); return b }
func put32(b []byte, at int, v uint32) []byte { binary.LittleEndian.PutUint32(b[at:], v); return b }
func put64(b []byte, at int, v uint64) []byte { binary.LittleEndian.PutUint64(b[at:], v); return b }

// TestDecode_Rejects checks every rejection of the decoder, in Dynamo's
// order, with the sentinel and the field it names.
func TestDecode_Rejects(t *testing.T) {
	delta := golden(t, goldenDelta)       // 2 images, 1024 buckets
	chunk := golden(t, goldenReadmeChunk) // 2 words, 2 buckets
	empty := golden(t, goldenEmptyDelta)  // 0 images
	cases := []struct {
		name  string
		in    []byte
		want  error
		field string
	}{
		{"empty input", nil, cbi1.ErrTruncated, ""},
		{"47 zero bytes (Dynamo fixture)", make([]byte, 47), cbi1.ErrTruncated, ""},
		{"one byte over the frame limit (Dynamo fixture)", make([]byte, cbi1.MaxFrameBytes+1), cbi1.ErrFrameTooLarge, ""},
		{"magic", mutate(t, delta, func(b []byte) []byte { b[3] = '2'; return b }), cbi1.ErrMagic, "magic"},
		{"wire version 2", mutate(t, delta, func(b []byte) []byte { return put16(b, 4, 2) }), cbi1.ErrWireVersion, "wire_version"},
		{"wire version 0", mutate(t, delta, func(b []byte) []byte { return put16(b, 4, 0) }), cbi1.ErrWireVersion, "wire_version"},
		{"a byte appended (Dynamo fixture)", append(append([]byte(nil), empty...), 1), cbi1.ErrChecksum, "body_checksum"},
		{"a body bit flipped", mutate(t, delta, func(b []byte) []byte { b[len(b)-1] ^= 1; return b }), cbi1.ErrChecksum, "body_checksum"},
		{"checksum field flipped", mutate(t, delta, func(b []byte) []byte { b[44] ^= 0x80; return b }), cbi1.ErrChecksum, "body_checksum"},
		{"a checksum only the high word of XXH3 would give", mutate(t, delta, func(b []byte) []byte {
			return put32(b, 44, uint32(xxh3.Hash(b[48:])>>32))
		}), cbi1.ErrChecksum, "body_checksum"},
		{"format version 2 (Dynamo fixture)", mutate(t, empty, func(b []byte) []byte { return put16(b, 10, 2) }), cbi1.ErrFormat, "format_version"},
		{"format version 257", mutate(t, empty, func(b []byte) []byte { return put16(b, 10, 257) }), cbi1.ErrFormat, "format_version"},
		{"8 fingerprint bits", mutate(t, empty, func(b []byte) []byte { b[8] = 8; return b }), cbi1.ErrFormat, "fingerprint_bits"},
		{"2 slots", mutate(t, empty, func(b []byte) []byte { b[9] = 2; return b }), cbi1.ErrFormat, "slots_per_bucket"},
		{"bucket count 0", mutate(t, empty, func(b []byte) []byte { return put64(b, 20, 0) }), cbi1.ErrFormat, "bucket_count"},
		{"bucket count 1", mutate(t, empty, func(b []byte) []byte { return put64(b, 20, 1) }), cbi1.ErrFormat, "bucket_count"},
		{"bucket count 1000 (not a power of two)", mutate(t, empty, func(b []byte) []byte { return put64(b, 20, 1000) }), cbi1.ErrFormat, "bucket_count"},
		{"bucket count 2^25", mutate(t, empty, func(b []byte) []byte { return put64(b, 20, 1<<25) }), cbi1.ErrFormat, "bucket_count"},
		{"bucket count 2^63", mutate(t, empty, func(b []byte) []byte { return put64(b, 20, 1<<63) }), cbi1.ErrFormat, "bucket_count"},
		{"flags 0x8000 (Dynamo fixture)", mutate(t, empty, func(b []byte) []byte { return put16(b, 6, 0x8000) }), cbi1.ErrFlags, "flags"},
		{"flags 0", mutate(t, empty, func(b []byte) []byte { return put16(b, 6, 0) }), cbi1.ErrFlags, "flags"},
		{"flags 3 (both)", mutate(t, empty, func(b []byte) []byte { return put16(b, 6, 3) }), cbi1.ErrFlags, "flags"},
		{"delta body shorter than its prefix", reseal(append([]byte(nil), delta[:48+11]...)), cbi1.ErrMalformed, "delta"},
		{"delta image count over the limit", mutate(t, empty, func(b []byte) []byte { return reseal(put32(b, 56, cbi1.MaxDeltaImages+1)) }), cbi1.ErrLimitExceeded, "image_count"},
		{"delta image count 2^32-1", mutate(t, empty, func(b []byte) []byte { return reseal(put32(b, 56, ^uint32(0))) }), cbi1.ErrLimitExceeded, "image_count"},
		{"delta count says 3, body holds 2", mutate(t, delta, func(b []byte) []byte { return reseal(put32(b, 56, 3)) }), cbi1.ErrMalformed, "image_count"},
		{"delta count says 1, body holds 2", mutate(t, delta, func(b []byte) []byte { return reseal(put32(b, 56, 1)) }), cbi1.ErrMalformed, "image_count"},
		{"delta with a partial image", reseal(append(append([]byte(nil), delta...), 0, 0, 0)), cbi1.ErrMalformed, "image_count"},
		{"delta bucket = bucket count", mutate(t, delta, func(b []byte) []byte { return reseal(put32(b, 72, 1024)) }), cbi1.ErrMalformed, "bucket"},
		{"delta bucket 2^32-1", mutate(t, delta, func(b []byte) []byte { return reseal(put32(b, 60, ^uint32(0))) }), cbi1.ErrMalformed, "bucket"},
		{"chunk body shorter than its prefix", reseal(append([]byte(nil), chunk[:48+15]...)), cbi1.ErrMalformed, "chunk"},
		{"chunk count 0", mutate(t, chunk, func(b []byte) []byte { return reseal(put32(b, 52, 0)) }), cbi1.ErrMalformed, "chunk_index"},
		{"chunk index = chunk count", mutate(t, chunk, func(b []byte) []byte { return reseal(put32(b, 48, 1)) }), cbi1.ErrMalformed, "chunk_index"},
		{"chunk words not a multiple of 8", reseal(append(append([]byte(nil), chunk...), 0)), cbi1.ErrMalformed, "words"},
		{"chunk words past the table", reseal(append(append([]byte(nil), chunk...), make([]byte, 8)...)), cbi1.ErrMalformed, "bucket_offset"},
		{"chunk offset 1 with two words of a 2-bucket table", mutate(t, chunk, func(b []byte) []byte { return reseal(put64(b, 56, 1)) }), cbi1.ErrMalformed, "bucket_offset"},
		{"chunk offset 2^64-1 (overflow)", mutate(t, chunk, func(b []byte) []byte { return reseal(put64(b, 56, ^uint64(0))) }), cbi1.ErrMalformed, "bucket_offset"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := cbi1.Frame{Words: []uint64{7}, BaseEpoch: 9}
			f := before
			err := cbi1.Decode(c.in, &f)
			require.ErrorIs(t, err, c.want)
			var e *cbi1.Error
			require.True(t, errors.As(err, &e))
			assert.Equal(t, c.field, e.Field)
			assert.Equal(t, before, f, "a failed decode leaves the frame unchanged")
		})
	}
}

// TestDecode_Accepts lists frames Dynamo's decoder accepts that a stricter
// reading might refuse; refusing them would break interoperability.
func TestDecode_Accepts(t *testing.T) {
	delta := golden(t, goldenDelta)
	chunk := golden(t, goldenReadmeChunk)
	cases := []struct {
		name string
		in   []byte
	}{
		{"empty delta", golden(t, goldenEmptyDelta)},
		{"unsorted delta images", mutate(t, delta, func(b []byte) []byte { return reseal(put32(put32(b, 60, 1000), 72, 3)) })},
		{"duplicate delta images", mutate(t, delta, func(b []byte) []byte { return reseal(put32(b, 72, 3)) })},
		{"empty chunk at the table's end", mutate(t, chunk[:64], func(b []byte) []byte { return reseal(put64(b, 56, 2)) })},
		{"chunk at an offset that is not index·512Ki", mutate(t, chunk[:72], func(b []byte) []byte { return reseal(put64(b, 56, 1)) })},
		{"chunk 3 of 4 of a 2-bucket table (assembly judges coverage)", mutate(t, chunk, func(b []byte) []byte { return reseal(put32(put32(b, 48, 3), 52, 4)) })},
		{"base epoch and epoch unrelated (the stream judges them)", mutate(t, delta, func(b []byte) []byte { return reseal(put64(put64(b, 48, 99), 36, 3)) })},
		{"any dc_id and seed", mutate(t, delta, func(b []byte) []byte { return reseal(put64(put64(b, 28, ^uint64(0)), 12, 0)) })},
		{"the largest bucket count", mutate(t, chunk, func(b []byte) []byte { return reseal(put64(b, 20, 1<<24)) })},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var f cbi1.Frame
			require.NoError(t, cbi1.Decode(c.in, &f))
			again, err := cbi1.AppendFrame(nil, &f)
			require.NoError(t, err)
			assert.Equal(t, c.in, again, "re-encodes to the same bytes")
		})
	}
}

func TestDecode_ReusesBuffers(t *testing.T) {
	f := cbi1.Frame{Words: make([]uint64, 0, 4), Images: make([]ckf.BucketImage, 0, 4)}
	words, images := f.Words[:1], f.Images[:1]
	require.NoError(t, cbi1.Decode(golden(t, goldenReadmeChunk), &f))
	require.NoError(t, cbi1.Decode(golden(t, goldenDelta), &f))
	assert.Same(t, &words[0], &f.Words[0])
	assert.Same(t, &images[0], &f.Images[0])
	assert.Equal(t, cbi1.KindDelta, f.Kind)
}

func TestHeader_CheckFormat(t *testing.T) {
	var f cbi1.Frame
	require.NoError(t, cbi1.Decode(golden(t, goldenEmptyDelta), &f))
	require.NoError(t, f.CheckFormat(dynamoFormat))
	// Dynamo's fixture: the same frame against a format whose seed differs by one bit.
	require.ErrorIs(t, f.CheckFormat(ckf.NewFormat(dynamoFormat.Seed^1, 1024)), cbi1.ErrFormat)
	require.ErrorIs(t, f.CheckFormat(ckf.NewFormat(dynamoFormat.Seed, 2048)), cbi1.ErrFormat)
}

func TestEncode_Rejects(t *testing.T) {
	images := make([]ckf.BucketImage, cbi1.MaxDeltaImages+1)
	_, err := cbi1.EncodeDelta(dynamoFormat, 7, 0, 1, images)
	require.ErrorIs(t, err, cbi1.ErrDeltaTooLarge, "Dynamo fixture: MaxDeltaImages+1 images")
	require.ErrorIs(t, err, cbi1.ErrInvalidFrame)

	full, err := cbi1.EncodeDelta(dynamoFormat, 7, 0, 1, images[:cbi1.MaxDeltaImages])
	require.NoError(t, err, "MaxDeltaImages images fit")
	assert.LessOrEqual(t, len(full), cbi1.MaxFrameBytes)

	_, err = cbi1.EncodeDelta(dynamoFormat, 7, 0, 1, []ckf.BucketImage{{Bucket: 1024, Word: 1}})
	require.ErrorIs(t, err, cbi1.ErrInvalidFrame, "Dynamo fixture: bucket = bucket count")

	_, err = cbi1.EncodeSnapshot(dynamoFormat, 7, 1, []uint64{0})
	require.ErrorIs(t, err, cbi1.ErrInvalidFrame, "Dynamo fixture: 1 word for a 1024-bucket format")

	_, err = cbi1.EncodeDelta(ckf.NewFormat(1, 1000), 7, 0, 1, nil)
	require.ErrorIs(t, err, cbi1.ErrInvalidFrame, "invalid format")

	bad := []cbi1.Frame{
		{Header: cbi1.Header{Kind: 3, Format: dynamoFormat}},
		{Header: cbi1.Header{Kind: cbi1.KindSnapshotChunk, Format: dynamoFormat}, ChunkCount: 0},
		{Header: cbi1.Header{Kind: cbi1.KindSnapshotChunk, Format: dynamoFormat}, ChunkIndex: 1, ChunkCount: 1},
		{Header: cbi1.Header{Kind: cbi1.KindSnapshotChunk, Format: dynamoFormat}, ChunkCount: 1, BucketOffset: 1020, Words: make([]uint64, 5)},
		{Header: cbi1.Header{Kind: cbi1.KindSnapshotChunk, Format: dynamoFormat}, ChunkCount: 1, BucketOffset: ^uint64(0), Words: make([]uint64, 1)},
	}
	for i := range bad {
		dst := []byte{1, 2}
		out, err := cbi1.AppendFrame(dst, &bad[i])
		require.ErrorIs(t, err, cbi1.ErrInvalidFrame, "frame %d", i)
		assert.Equal(t, dst, out, "dst unchanged")
	}
}

// TestSnapshotChunks_Split checks the split at and around the chunk size.
func TestSnapshotChunks_Split(t *testing.T) {
	for _, n := range []uint64{2, 1024, cbi1.MaxChunkBuckets, 2 * cbi1.MaxChunkBuckets, 1 << 24} {
		words := make([]uint64, n)
		frames, err := cbi1.SnapshotChunks(ckf.NewFormat(1, n), 3, 4, words)
		require.NoError(t, err)
		want := int((n + cbi1.MaxChunkBuckets - 1) / cbi1.MaxChunkBuckets)
		require.Len(t, frames, want, "n=%d", n)
		var next uint64
		for i, f := range frames {
			assert.Equal(t, uint32(i), f.ChunkIndex)
			assert.Equal(t, uint32(want), f.ChunkCount)
			assert.Equal(t, next, f.BucketOffset)
			assert.LessOrEqual(t, len(f.Words), cbi1.MaxChunkBuckets)
			assert.NotEmpty(t, f.Words)
			next += uint64(len(f.Words))
		}
		assert.Equal(t, n, next)
	}
}

// TestDecodeFor_FormatBeforeFlags: Dynamo's decoder takes the expected
// format and checks it (version, fingerprint bits, slots, then seed and
// bucket count) before the flags and the body (cbi1.rs @3e611dbc, decode);
// DecodeFor reports the same class for the same bad frame.
func TestDecodeFor_FormatBeforeFlags(t *testing.T) {
	empty := golden(t, goldenEmptyDelta)
	delta := golden(t, goldenDelta)
	other := ckf.NewFormat(dynamoFormat.Seed^1, dynamoFormat.BucketCount) // Dynamo's fixture: one seed bit off
	cases := []struct {
		name  string
		want  ckf.Format
		in    []byte
		err   error
		field string
	}{
		{"Dynamo fixture: another seed", other, empty, cbi1.ErrFormat, "format"},
		{"another bucket count", ckf.NewFormat(dynamoFormat.Seed, 2048), empty, cbi1.ErrFormat, "format"},
		{"another seed and flags 0x8000", other, mutate(t, empty, func(b []byte) []byte { return put16(b, 6, 0x8000) }), cbi1.ErrFormat, "format"},
		{"another seed and a malformed body", other, mutate(t, delta, func(b []byte) []byte { return reseal(put32(b, 56, 3)) }), cbi1.ErrFormat, "format"},
		{"another seed and too many images", other, mutate(t, empty, func(b []byte) []byte { return reseal(put32(b, 56, cbi1.MaxDeltaImages+1)) }), cbi1.ErrFormat, "format"},
		{"another seed and format version 2: the version first", other, mutate(t, empty, func(b []byte) []byte { return put16(b, 10, 2) }), cbi1.ErrFormat, "format_version"},
		{"another seed and a bad checksum: the checksum first", other, append(append([]byte(nil), empty...), 1), cbi1.ErrChecksum, "body_checksum"},
		{"Dynamo fixture: the expected format and flags 0x8000", dynamoFormat, mutate(t, empty, func(b []byte) []byte { return put16(b, 6, 0x8000) }), cbi1.ErrFlags, "flags"},
		{"the expected format and a malformed body", dynamoFormat, mutate(t, delta, func(b []byte) []byte { return reseal(put32(b, 56, 3)) }), cbi1.ErrMalformed, "image_count"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := cbi1.Frame{Words: []uint64{7}, BaseEpoch: 9}
			f := before
			err := cbi1.DecodeFor(c.in, c.want, &f)
			require.ErrorIs(t, err, c.err)
			var e *cbi1.Error
			require.True(t, errors.As(err, &e))
			assert.Equal(t, c.field, e.Field)
			assert.Equal(t, before, f, "a failed decode leaves the frame unchanged")
		})
	}
	var f cbi1.Frame
	require.NoError(t, cbi1.DecodeFor(delta, dynamoFormat, &f))
	var g cbi1.Frame
	require.NoError(t, cbi1.Decode(delta, &g))
	assert.Equal(t, g, f, "DecodeFor of a frame in the expected format is Decode")
}
