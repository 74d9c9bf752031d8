package cbi1_test

import (
	"encoding/binary"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire/cbi1"
)

// The vectors below were written from the field tables of Dynamo's CBI1
// README (docs/wire.md §8) and their checksums computed with Python's
// xxhash package (python3-xxhash), not with this package: the encoder must
// reproduce them byte for byte and the decoder must read them back. The
// fixtures are those of Dynamo's own codec tests (cbi1.rs @3e611dbc): seed
// 0x5EED, 1024 buckets, dc 7.

// unhex decodes a hex literal that may be split by spaces and newlines.
// A nil t (fuzz seeds) panics on a bad literal.
func unhex(t *testing.T, s string) []byte {
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if t == nil {
		if err != nil {
			panic(err)
		}
		return b
	}
	t.Helper()
	require.NoError(t, err)
	return b
}

var dynamoFormat = ckf.NewFormat(0x5EED, 1024)

// goldenDelta is Dynamo's delta_round_trips_absolute_images fixture: base 4
// → epoch 5, images {3 → 0xAAAABBBBCCCCDDDD, 1000 → 42}.
const goldenDelta = `
43424931 0100 0200 10 04 0100          # magic "CBI1", wire 1, flags 2 (delta), 16 bits, 4 slots, format 1
ed5e000000000000                       # seed 0x5EED
0004000000000000                       # bucket_count 1024
0700000000000000                       # dc_id 7
0500000000000000                       # epoch 5
4ef64661                               # body_checksum 0x6146f64e
0400000000000000 02000000              # base_epoch 4, image_count 2
03000000 ddddccccbbbbaaaa              # bucket 3, word 0xAAAABBBBCCCCDDDD
e8030000 2a00000000000000              # bucket 1000, word 42
`

// goldenEmptyDelta is the empty delta (base 0 → epoch 1) Dynamo's
// corruption tests start from.
const goldenEmptyDelta = `
43424931 0100 0200 10 04 0100 ed5e000000000000 0004000000000000 0700000000000000 0100000000000000
f0a4c269
0000000000000000 00000000
`

// goldenReadmeChunk is a one-chunk snapshot of a 2-bucket table (seed
// 0x5DEECE66D1B54A33, dc 1, epoch 1) whose bucket 0 is the README's example
// word: bytes 34 12 00 00 cd ab 01 00 = slots [0x1234, 0, 0xabcd, 1].
const goldenReadmeChunk = `
43424931 0100 0100 10 04 0100          # flags 1 (snapshot chunk)
334ab5d166ceee5d 0200000000000000 0100000000000000 0100000000000000
9dc0f237                               # body_checksum 0x37f2c09d
00000000 01000000 0000000000000000     # chunk 0 of 1 at bucket 0
34120000cdab0100                       # bucket 0
0000000000000000                       # bucket 1 (empty)
`

// stripComments drops everything from a '#' to the end of each line.
func stripComments(s string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		line, _, _ = strings.Cut(line, "#")
		out = append(out, line)
	}
	return strings.Join(out, " ")
}

func golden(t *testing.T, s string) []byte { return unhex(t, stripComments(s)) }

func TestGolden_Delta(t *testing.T) {
	want := golden(t, goldenDelta)
	images := []ckf.BucketImage{{Bucket: 3, Word: 0xAAAA_BBBB_CCCC_DDDD}, {Bucket: 1000, Word: 42}}
	got, err := cbi1.EncodeDelta(dynamoFormat, 7, 4, 5, images)
	require.NoError(t, err)
	assert.Equal(t, hex.EncodeToString(want), hex.EncodeToString(got))

	var f cbi1.Frame
	require.NoError(t, cbi1.Decode(want, &f))
	assert.Equal(t, cbi1.Header{Kind: cbi1.KindDelta, Format: dynamoFormat, DCID: 7, Epoch: 5}, f.Header)
	assert.Equal(t, uint64(4), f.BaseEpoch)
	assert.Equal(t, images, f.Images)
}

func TestGolden_EmptyDelta(t *testing.T) {
	want := golden(t, goldenEmptyDelta)
	got, err := cbi1.EncodeDelta(dynamoFormat, 7, 0, 1, nil)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	var f cbi1.Frame
	require.NoError(t, cbi1.Decode(want, &f))
	assert.Empty(t, f.Images)
	assert.Equal(t, uint64(1), f.Epoch)
}

// TestGolden_ReadmeWord pins the word layout: the README's example bytes are
// the little-endian ckf.Bucket with those four slots (SPEC §2.3), with no
// conversion between ckf's table words and CBI1's.
func TestGolden_ReadmeWord(t *testing.T) {
	word := ckf.Bucket(0).WithSlot(0, 0x1234).WithSlot(2, 0xabcd).WithSlot(3, 1)
	assert.Equal(t, unhex(t, "34120000cdab0100"), binary.LittleEndian.AppendUint64(nil, uint64(word)))

	format := ckf.NewFormat(ckf.DefaultSeed, 2)
	got, err := cbi1.EncodeSnapshot(format, 1, 1, []uint64{uint64(word), 0})
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, hex.EncodeToString(golden(t, goldenReadmeChunk)), hex.EncodeToString(got[0]))

	var f cbi1.Frame
	require.NoError(t, cbi1.Decode(got[0], &f))
	b := ckf.Bucket(f.Words[0])
	assert.Equal(t, []uint16{0x1234, 0, 0xabcd, 1}, []uint16{b.Slot(0), b.Slot(1), b.Slot(2), b.Slot(3)})
}

// TestGolden_DynamoSnapshot is Dynamo's
// snapshot_chunks_rebuild_exact_lane_and_reject_reordering fixture: a 2^20
// bucket table (seed 0x5EED, dc 9, epoch 6) with words 0, 512 Ki + 1 and the
// last set to 11, 22, 33 splits into two chunks whose first 80 bytes and
// checksums are pinned, rebuilds exactly, and refuses its chunks reordered.
func TestGolden_DynamoSnapshot(t *testing.T) {
	format := ckf.NewFormat(0x5EED, 1<<20)
	words := make([]uint64, format.BucketCount)
	words[0], words[cbi1.MaxChunkBuckets+1], words[len(words)-1] = 11, 22, 33
	chunks, err := cbi1.EncodeSnapshot(format, 9, 6, words)
	require.NoError(t, err)
	require.Len(t, chunks, 2)
	heads := []string{
		`43424931 0100 0100 10 04 0100 ed5e000000000000 0000100000000000 0900000000000000 0600000000000000
		 45c7037d  00000000 02000000 0000000000000000  0b00000000000000 0000000000000000`,
		`43424931 0100 0100 10 04 0100 ed5e000000000000 0000100000000000 0900000000000000 0600000000000000
		 769927a7  01000000 02000000 0000080000000000  0000000000000000 1600000000000000`,
	}
	for i, c := range chunks {
		require.Len(t, c, cbi1.MaxFrameBytes, "chunk %d is a full chunk", i)
		assert.Equal(t, hex.EncodeToString(unhex(t, heads[i])), hex.EncodeToString(c[:80]), "chunk %d", i)
	}
	assert.Equal(t, unhex(t, "2100000000000000"), chunks[1][len(chunks[1])-8:], "last word 33")

	frames := make([]cbi1.Frame, len(chunks))
	for i, c := range chunks {
		require.NoError(t, cbi1.Decode(c, &frames[i]))
	}
	var reordered cbi1.Assembler
	_, err = reordered.Add(&frames[1])
	require.ErrorIs(t, err, cbi1.ErrChunkSequence)

	var a cbi1.Assembler
	done, err := a.Add(&frames[0])
	require.NoError(t, err)
	require.False(t, done)
	require.Nil(t, a.Words())
	done, err = a.Add(&frames[1])
	require.NoError(t, err)
	require.True(t, done)
	assert.Equal(t, words, a.Words())
	assert.Equal(t, uint64(6), a.Header().Epoch)
}

// TestGolden_Limits pins the numbers Dynamo derives: a full chunk frame is
// 4,194,368 bytes and a delta holds at most 349,525 images.
func TestGolden_Limits(t *testing.T) {
	assert.Equal(t, 4_194_368, cbi1.MaxFrameBytes)
	assert.Equal(t, 349_525, cbi1.MaxDeltaImages)
	assert.Equal(t, 524_288, cbi1.MaxChunkBuckets)
	assert.LessOrEqual(t, 48+12+12*cbi1.MaxDeltaImages, cbi1.MaxFrameBytes)
	assert.Greater(t, 48+12+12*(cbi1.MaxDeltaImages+1), cbi1.MaxFrameBytes)
}
