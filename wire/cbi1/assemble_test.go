package cbi1_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire/cbi1"
)

// smallChunks is a snapshot of an 8-bucket table in chunks of 3, 3 and 2
// words (a producer may chunk smaller than Dynamo does).
func smallChunks() []cbi1.Frame {
	h := cbi1.Header{Kind: cbi1.KindSnapshotChunk, Format: ckf.NewFormat(5, 8), DCID: 2, Epoch: 10}
	words := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
	return []cbi1.Frame{
		{Header: h, ChunkIndex: 0, ChunkCount: 3, BucketOffset: 0, Words: words[0:3]},
		{Header: h, ChunkIndex: 1, ChunkCount: 3, BucketOffset: 3, Words: words[3:6]},
		{Header: h, ChunkIndex: 2, ChunkCount: 3, BucketOffset: 6, Words: words[6:8]},
	}
}

func TestAssembler_InOrder(t *testing.T) {
	var a cbi1.Assembler
	fs := smallChunks()
	for round := range 2 { // the second snapshot reuses the table
		for i := range fs {
			done, err := a.Add(&fs[i])
			require.NoError(t, err)
			assert.Equal(t, i == len(fs)-1, done, "round %d chunk %d", round, i)
		}
		assert.Equal(t, []uint64{1, 2, 3, 4, 5, 6, 7, 8}, a.Words())
	}
}

func TestAssembler_Rejects(t *testing.T) {
	cases := []struct {
		name string
		edit func(fs []cbi1.Frame) []cbi1.Frame
		want error
	}{
		{"starts at chunk 1", func(fs []cbi1.Frame) []cbi1.Frame { return fs[1:] }, cbi1.ErrChunkSequence},
		{"skips a chunk", func(fs []cbi1.Frame) []cbi1.Frame { return []cbi1.Frame{fs[0], fs[2]} }, cbi1.ErrChunkSequence},
		{"repeats a chunk", func(fs []cbi1.Frame) []cbi1.Frame { return []cbi1.Frame{fs[0], fs[1], fs[1]} }, cbi1.ErrChunkSequence},
		{"another epoch", func(fs []cbi1.Frame) []cbi1.Frame { fs[1].Epoch++; return fs }, cbi1.ErrChunkSequence},
		{"another dc", func(fs []cbi1.Frame) []cbi1.Frame { fs[1].DCID++; return fs }, cbi1.ErrChunkSequence},
		{"another seed", func(fs []cbi1.Frame) []cbi1.Frame { fs[2].Format.Seed++; return fs }, cbi1.ErrChunkSequence},
		{"another chunk count", func(fs []cbi1.Frame) []cbi1.Frame { fs[1].ChunkCount = 4; return fs }, cbi1.ErrChunkSequence},
		{"gap between chunks", func(fs []cbi1.Frame) []cbi1.Frame { fs[1].BucketOffset, fs[1].Words = 4, fs[1].Words[1:]; return fs }, cbi1.ErrChunkSequence},
		{"overlap between chunks", func(fs []cbi1.Frame) []cbi1.Frame { fs[1].BucketOffset = 2; return fs }, cbi1.ErrChunkSequence},
		{"chunk 0 not at bucket 0", func(fs []cbi1.Frame) []cbi1.Frame { fs[0].BucketOffset = 1; return fs }, cbi1.ErrChunkSequence},
		{"last chunk short of the table", func(fs []cbi1.Frame) []cbi1.Frame { fs[2].Words = fs[2].Words[:1]; return fs }, cbi1.ErrIncompleteCoverage},
		{"a delta in the middle", func(fs []cbi1.Frame) []cbi1.Frame {
			return []cbi1.Frame{fs[0], {Header: cbi1.Header{Kind: cbi1.KindDelta, Format: fs[0].Format}}}
		}, cbi1.ErrChunkSequence},
		{"words past the table (hand-built)", func(fs []cbi1.Frame) []cbi1.Frame { fs[2].Words = append(fs[2].Words, 9); return fs }, cbi1.ErrMalformed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var a cbi1.Assembler
			fs := c.edit(smallChunks())
			var err error
			for i := range fs {
				var done bool
				done, err = a.Add(&fs[i])
				if err != nil {
					break
				}
				require.False(t, done)
			}
			require.ErrorIs(t, err, c.want)
			assert.Nil(t, a.Words())
			// After a violation the assembler starts over at the next chunk 0.
			for i, f := range smallChunks() {
				done, err := a.Add(&f)
				require.NoError(t, err)
				assert.Equal(t, i == 2, done)
			}
		})
	}
}

// TestAssembler_Chunk0Restarts checks that chunk 0 abandons a partial
// snapshot, as Dynamo's assembly does.
func TestAssembler_Chunk0Restarts(t *testing.T) {
	var a cbi1.Assembler
	fs := smallChunks()
	_, err := a.Add(&fs[0])
	require.NoError(t, err)
	_, err = a.Add(&fs[1])
	require.NoError(t, err)
	newer := smallChunks()
	for i := range newer {
		newer[i].Epoch = 11
		newer[i].Words = []uint64{9, 9, 9}[:len(newer[i].Words)]
	}
	for i := range newer {
		_, err := a.Add(&newer[i])
		require.NoError(t, err)
	}
	assert.Equal(t, []uint64{9, 9, 9, 9, 9, 9, 9, 9}, a.Words())
	assert.Equal(t, uint64(11), a.Header().Epoch)
}
