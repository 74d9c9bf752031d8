// Package streamtable reads a pool's HTTP frame stream into its table for
// tests that compare another transport or a router with the relay's own
// stream, the reference.
package streamtable

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/wire"
)

// At follows pool's stream on the relay at base (consumer instance consumer,
// lane 0, a fresh epoch) until its installed table is at sequence at and
// returns the table. It fails the test if the stream passes at, closes, or
// has not reached it within timeout.
func At(t testing.TB, base, pool string, consumer, at uint64, timeout time.Duration) []uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		fmt.Sprintf("%s/v1/pools/%s/stream?consumer=%d&lane=0&epoch=%d", base, pool, consumer, time.Now().UnixNano()), nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	rd := wire.NewReader(resp.Body, 0)
	var words []uint64
	var seq uint64
	installed := false
	for {
		var f wire.Frame
		require.NoError(t, rd.ReadFrame(&f))
		switch f.Kind {
		case wire.KindSnapshotChunk:
			c := f.Snapshot
			if words == nil {
				words = make([]uint64, c.Identity.Format.BucketCount)
			}
			copy(words[c.BucketOffset:], c.Words)
			if c.ChunkIndex+1 == c.ChunkCount {
				seq, installed = c.Sequence, true
			}
		case wire.KindDelta:
			for _, im := range f.Delta.Images {
				words[im.Bucket] = im.Word
			}
			seq = f.Delta.Sequence
		case wire.KindClose:
			require.FailNow(t, "HTTP stream closed", "%+v", f.Close)
		}
		if installed && seq >= at {
			require.Equal(t, at, seq, "the HTTP stream passed the sequence")
			return words
		}
	}
}
