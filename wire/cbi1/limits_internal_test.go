package cbi1

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// TestDecodeChunk_WordLimit reaches the chunk word limit directly, as
// Dynamo's test does: through Decode, a chunk over MaxChunkBuckets words is
// always over MaxFrameBytes first.
func TestDecodeChunk_WordLimit(t *testing.T) {
	h := Header{Kind: KindSnapshotChunk, Format: ckf.NewFormat(0x5EED, ckf.MaxBucketCount), DCID: 7, Epoch: 1}
	body := make([]byte, chunkPrefixLen+8*(MaxChunkBuckets+1))
	body[4] = 1 // chunk_count 1
	var f Frame
	require.ErrorIs(t, decodeChunk(&h, body, &f), ErrLimitExceeded)
	require.NoError(t, decodeChunk(&h, body[:len(body)-8], &f))
	require.Len(t, f.Words, MaxChunkBuckets)
}
