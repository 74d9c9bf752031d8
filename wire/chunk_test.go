package wire_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire"
)

func TestChunkWords(t *testing.T) {
	tests := []struct {
		limit, want int
	}{
		{0, 1048557},
		{wire.DefaultMaxFrameBytes, 1048557},
		{wire.MaxSnapshotChunkOverhead + 8, 1},
		{wire.MaxSnapshotChunkOverhead + 15, 1},
		{wire.MaxSnapshotChunkOverhead + 16, 2},
	}
	for _, tt := range tests {
		got, err := wire.ChunkWords(tt.limit)
		if assert.NoError(t, err, "ChunkWords(%d)", tt.limit) {
			assert.Equal(t, tt.want, got, "ChunkWords(%d)", tt.limit)
		}
	}
	_, err := wire.ChunkWords(wire.MaxSnapshotChunkOverhead + 7)
	assert.ErrorIs(t, err, wire.ErrInvalidFrame, "ChunkWords(overhead+7)")
}

// TestMaxSnapshotChunkOverhead_IsTight encodes a chunk with every field at
// its widest and checks the overhead constant is exactly its size.
func TestMaxSnapshotChunkOverhead_IsTight(t *testing.T) {
	id := testIdentity()
	id.Pool.DCID, id.ProducerIncarnation, id.LayoutGeneration = math.MaxUint64, math.MaxUint64, math.MaxUint64
	id.Format = ckf.Format{Version: 255, Seed: math.MaxUint64, BucketCount: math.MaxUint64, FingerprintBits: 255, SlotsPerBucket: 255}
	words := make([]uint64, 65536/8+1) // forces a bin32 header
	f := wire.Frame{Kind: wire.KindSnapshotChunk, Snapshot: wire.SnapshotChunk{
		Identity: id, Lease: ckf.LaneLease{ConsumerInstance: math.MaxUint64, PhysicalLane: 255, AssignmentEpoch: math.MaxUint64},
		Sequence: math.MaxUint64, ChunkIndex: math.MaxUint32 - 1, ChunkCount: math.MaxUint32,
		BucketOffset: math.MaxUint64 - uint64(len(words)), Words: words,
	}}
	b, err := wire.AppendFrame(nil, &f)
	require.NoError(t, err)
	got := len(b) - 8*len(words)
	require.Equal(t, wire.MaxSnapshotChunkOverhead, got, "overhead: got %d, want %d", got, wire.MaxSnapshotChunkOverhead)
}

func TestSplitSnapshot(t *testing.T) {
	per := 10
	limit := wire.MaxSnapshotChunkOverhead + 8*per
	tests := []struct {
		words, chunks int
	}{
		{1, 1}, {10, 1}, {11, 2}, {20, 2}, {21, 3}, {1024, 103},
	}
	for _, tt := range tests {
		words := make([]uint64, tt.words)
		for i := range words {
			words[i] = uint64(i + 1)
		}
		s := &ckf.Snapshot{Identity: testIdentity(), Lease: testLease(), Sequence: 3, Words: words}
		chunks, err := wire.SplitSnapshot(s, limit)
		require.NoError(t, err)
		require.Len(t, chunks, tt.chunks, "%d words: got %d chunks, want %d", tt.words, len(chunks), tt.chunks)
		next := 0
		for i, c := range chunks {
			require.Equal(t, uint32(i), c.ChunkIndex, "chunk %d: index", i)
			require.Equal(t, uint32(tt.chunks), c.ChunkCount, "chunk %d: count", i)
			require.Equal(t, uint64(next), c.BucketOffset, "chunk %d: offset", i)
			require.Equal(t, s.Identity, c.Identity, "chunk %d: identity", i)
			require.Equal(t, s.Lease, c.Lease, "chunk %d: lease", i)
			require.Equal(t, s.Sequence, c.Sequence, "chunk %d: sequence", i)
			require.LessOrEqual(t, len(c.Words), per, "chunk %d: %d words, want %d", i, len(c.Words), per)
			require.False(t, i < len(chunks)-1 && len(c.Words) != per, "chunk %d: %d words, want %d", i, len(c.Words), per)
			for j, w := range c.Words {
				require.Equal(t, uint64(next+j+1), w, "chunk %d word %d: got %d, want %d", i, j, w, next+j+1)
			}
			next += len(c.Words)
			f := wire.Frame{Kind: wire.KindSnapshotChunk, Snapshot: c}
			b, err := wire.AppendFrame(nil, &f)
			require.NoError(t, err, "chunk %d", i)
			require.LessOrEqual(t, len(b), limit, "chunk %d: frame bytes", i)
		}
		require.Equal(t, tt.words, next, "covered %d words, want %d", next, tt.words)
	}
}

// TestSplitSnapshot_NeverEmitsAnEmptyChunk: every chunk carries at least one
// word (SPEC §9, decision: chunks are non-empty), so chunk_count ≤ the word
// count; a snapshot with no words is refused instead of becoming one empty
// chunk, which a consumer rejects as MalformedChunk.
func TestSplitSnapshot_NeverEmitsAnEmptyChunk(t *testing.T) {
	_, err := wire.SplitSnapshot(&ckf.Snapshot{Identity: testIdentity(), Lease: testLease(), Sequence: 3}, 0)
	require.ErrorIs(t, err, wire.ErrInvalidFrame)
	for _, per := range []int{1, 2, 3, 7} {
		limit := wire.MaxSnapshotChunkOverhead + 8*per
		for n := 1; n <= 3*per+1; n++ {
			chunks, err := wire.SplitSnapshot(&ckf.Snapshot{Identity: testIdentity(), Words: make([]uint64, n)}, limit)
			require.NoError(t, err)
			require.LessOrEqual(t, len(chunks), n)
			for _, c := range chunks {
				require.NotEmpty(t, c.Words, "%d words at %d a chunk: chunk %d of %d", n, per, c.ChunkIndex, c.ChunkCount)
			}
		}
	}
}
