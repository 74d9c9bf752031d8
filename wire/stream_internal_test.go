package wire

import (
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// TestWriter_ReleasesLargeBuffers: after a frame larger than
// RetainedBufferBytes the writer keeps no buffer that size; small frames
// still reuse theirs.
func TestWriter_ReleasesLargeBuffers(t *testing.T) {
	w := NewWriter(io.Discard, 0)
	small := Frame{Kind: KindDrainMarker, Drain: ckf.DrainMarker{ExpectedSequence: 7}}
	require.NoError(t, w.WriteFrame(&small))
	require.NotEqual(t, 0, cap(w.buf), "a small frame's buffer was not kept for reuse")
	images := make([]ckf.BucketImage, RetainedBufferBytes/ImageBytes+1)
	for i := range images {
		images[i].Bucket = uint32(i)
	}
	big := Frame{Kind: KindDelta, Delta: ckf.Delta{Identity: ckf.ProducerIdentity{Format: ckf.NewFormat(1, 1<<20)},
		BaseSequence: 1, Sequence: 2, Images: images}}
	require.NoError(t, w.WriteFrame(&big))
	c := cap(w.buf)
	require.LessOrEqual(t, c, RetainedBufferBytes, "writer kept a %d-byte buffer after a large frame, limit %d", c, RetainedBufferBytes)
	require.NoError(t, w.WriteRaw(make([]byte, RetainedBufferBytes+1)))
	c = cap(w.buf)
	require.LessOrEqual(t, c, RetainedBufferBytes, "WriteRaw kept a %d-byte buffer", c)
}

// TestWriter_HoldKeepsOneBufferForLargeFrames: between Hold and Release a
// run of large frames (a snapshot's chunks) encodes into one buffer — no
// allocation per frame — and Release hands it back for the next stream,
// leaving the writer with none.
func TestWriter_HoldKeepsOneBufferForLargeFrames(t *testing.T) {
	w := NewWriter(io.Discard, 0)
	words := make([]uint64, RetainedBufferBytes/8)
	chunk := Frame{Kind: KindSnapshotChunk, Snapshot: SnapshotChunk{Identity: ckf.ProducerIdentity{Format: ckf.NewFormat(1, 1<<20)},
		ChunkCount: 4, Words: words}}
	w.Hold(nil)
	require.NoError(t, w.WriteFrame(&chunk)) // grows the held buffer once
	allocs := testing.AllocsPerRun(10, func() { require.NoError(t, w.WriteFrame(&chunk)) })
	require.Zero(t, allocs, "a held writer allocated per large frame")
	b := w.Release()
	require.Greater(t, cap(b), RetainedBufferBytes, "Release did not return the held buffer")
	require.Zero(t, cap(w.buf), "the writer kept a buffer after Release")

	// The returned buffer serves the next writer without growing.
	w2 := NewWriter(io.Discard, 0)
	w2.Hold(b)
	allocs = testing.AllocsPerRun(10, func() { require.NoError(t, w2.WriteFrame(&chunk)) })
	require.Zero(t, allocs)
	require.Equal(t, cap(b), cap(w2.Release()))
}
