package server

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/wire"
)

// storedBatchJSON returns a JSON batch of one Stored event of n root-chained
// blocks for worker w, with block and token hashes derived from seed.
func storedBatchJSON(w uint64, seed uint64, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `[{"worker_id": %d, "event": {"event_id": %d, "data": {"stored": {"parent_hash": null, "blocks": [`, w, seed)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"block_hash": %d, "tokens_hash": %d}`, seed<<32|uint64(i), seed<<40|uint64(i)*2654435761)
	}
	b.WriteString(`]}}}}]`)
	return b.String()
}

// TestStream_OversizeDeltaClosesForResnapshot: a delta whose frame exceeds
// max_frame_bytes (deltas are never split) ends the stream with a lagged
// close frame that says why — never a silent EOF — and a new subscription
// gets the state as a chunked snapshot.
func TestStream_OversizeDeltaClosesForResnapshot(t *testing.T) {
	cfg := Config{
		Pools:             []PoolSpec{{Name: "big", DCID: 1, ExpectedBlocks: 65536, PublishEveryNEvents: 1}},
		MaxFrameBytes:     1 << 16, // 5,461 images at most
		MaxBlocksPerEvent: 4096,
		HeartbeatInterval: Duration(time.Hour),
	}
	_, ts := startTestServer(t, cfg)
	sr, _ := openStream(t, ts.URL, "big", 1, 0, 1)
	for { // the initial snapshot: 256 KiB of words in 64 KiB frames
		require.Equal(t, wire.KindSnapshotChunk, sr.next(), "frame before the snapshot's last chunk")
		if sr.f.Snapshot.ChunkIndex+1 == sr.f.Snapshot.ChunkCount {
			break
		}
	}
	for seed := uint64(1); seed <= 4; seed++ { // 4 × 3,000 blocks, each event's delta fits
		code, body := post(t, ts.URL+"/v1/pools/big/events?source_epoch=1", "application/json", storedBatchJSON(7, seed, 3000))
		require.Equal(t, http.StatusAccepted, code, "post: %v", body)
	}
	// Resetting the rank removes 12,000 fingerprints in one delta: too big for one frame.
	code, body := post(t, ts.URL+"/v1/pools/big/ranks/reset", "application/json", `{"worker_id": 7, "source_epoch": 1}`)
	require.Equal(t, http.StatusOK, code, "reset: %v", body)
	for {
		k := sr.next()
		if k == wire.KindDelta {
			continue
		}
		require.Equal(t, wire.KindClose, k, "want deltas then a close frame")
		assert.Equal(t, wire.CloseLagged, sr.f.Close.Reason, "close reason")
		assert.Contains(t, sr.f.Close.Message, "frame limit", "close message")
		break
	}
	resp, err := http.Get(ts.URL + "/metrics")
	require.NoError(t, err)
	metrics, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Contains(t, string(metrics), `ckfrelay_stream_oversize_deltas_total{pool="big"} 1`, "oversize delta not counted in /metrics")
	// A resubscription gets the reset table (chunked: 256 KiB of words > one 64 KiB frame).
	sr2, _ := openStream(t, ts.URL, "big", 1, 0, 2)
	chunks := 0
	for {
		require.Equal(t, wire.KindSnapshotChunk, sr2.next(), "resubscription did not start with snapshot chunks")
		chunks++
		if sr2.f.Snapshot.ChunkIndex+1 == sr2.f.Snapshot.ChunkCount {
			break
		}
	}
	for i, w := range sr2.words {
		require.Zero(t, w, "bucket %d after the reset", i)
	}
	assert.GreaterOrEqual(t, chunks, 2, "snapshot chunks: want several")
}

// TestStream_SlowReaderGetsWholeSnapshot: the write deadline bounds each
// frame, not the whole snapshot, so a slow but live subscriber can take a
// snapshot that needs longer than stream_write_timeout in total.
func TestStream_SlowReaderGetsWholeSnapshot(t *testing.T) {
	if testing.Short() {
		t.Skip("reads a 16 MiB snapshot slowly")
	}
	cfg := Config{
		Pools:              []PoolSpec{{Name: "big", DCID: 1, ExpectedBlocks: 1 << 22}}, // 2^21 buckets: 16 MiB
		StreamWriteTimeout: Duration(500 * time.Millisecond),
		HeartbeatInterval:  Duration(time.Hour),
	}
	_, ts := startTestServer(t, cfg)
	resp, err := http.Get(ts.URL + "/v1/pools/big/stream?consumer=1&lane=0&epoch=1")
	require.NoError(t, err)
	defer resp.Body.Close()
	// About 12 MB/s: the 16 MiB snapshot takes ≈ 1.4 s, three write timeouts.
	slow := readerFunc(func(p []byte) (int, error) {
		time.Sleep(5 * time.Millisecond)
		return resp.Body.Read(p[:min(len(p), 64<<10)])
	})
	r := wire.NewReader(slow, 0)
	var f wire.Frame
	start := time.Now()
	for {
		err := r.ReadFrame(&f)
		require.NoError(t, err, "after %v (the stream was cut mid-snapshot)", time.Since(start))
		require.Equal(t, wire.KindSnapshotChunk, f.Kind, "frame before the last chunk")
		if f.Snapshot.ChunkIndex+1 == f.Snapshot.ChunkCount {
			break
		}
	}
	assert.GreaterOrEqual(t, time.Since(start), time.Duration(cfg.StreamWriteTimeout),
		"the snapshot took less than one write timeout: the test proves nothing")
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// TestStream_NewerLeaseFencesTheOldStream: resubscribing a lane with a higher
// epoch ends the older stream of the same (consumer, lane) with a fenced close
// frame, so a half-open zombie does not keep its slot.
func TestStream_NewerLeaseFencesTheOldStream(t *testing.T) {
	_, ts := startTestServer(t, testConfig())
	old, _ := openStream(t, ts.URL, "dc-a", 5, 3, 1)
	require.Equal(t, wire.KindSnapshotChunk, old.next(), "old stream: no snapshot")
	cur, _ := openStream(t, ts.URL, "dc-a", 5, 3, 2)
	require.Equal(t, wire.KindSnapshotChunk, cur.next(), "new stream: no snapshot")
	for {
		switch old.next() {
		case wire.KindHeartbeat:
			continue
		case wire.KindClose:
			assert.Equal(t, wire.CloseFenced, old.f.Close.Reason, "old stream's close reason")
			return
		default:
			require.Failf(t, "old stream got a frame other than heartbeat or close", "kind %v", old.f.Kind)
		}
	}
}
