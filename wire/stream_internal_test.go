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
