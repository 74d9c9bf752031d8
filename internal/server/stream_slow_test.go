package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// heapBytes returns the live heap after a full collection.
func heapBytes() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// waitSequence waits until the pool's hub mirror has reached at least seq.
func waitSequence(t *testing.T, p *hostedPool, seq uint64) {
	t.Helper()
	require.Eventually(t, func() bool { return p.mirror().Stats().Sequence >= seq }, 10*time.Second, time.Millisecond,
		"hub never reached sequence %d", seq)
}

// TestStream_SlowSubscribersDoNotPinATableEach: a dozen subscribers that
// stop reading in the middle of their snapshots, each arriving after the
// table changed, must not cost a table copy each (12 slow readers
// of a 64 MiB table took the relay to 1.73 GB). Snapshot memory stays within
// a couple of tables whatever the number of slow readers.
func TestStream_SlowSubscribersDoNotPinATableEach(t *testing.T) {
	cfg := Config{
		Pools:              []PoolSpec{{Name: "big", DCID: 1, ExpectedBlocks: 6_000_000, PublishEveryNEvents: 1}},
		MaxFrameBytes:      256 << 10,
		HeartbeatInterval:  Duration(time.Hour),
		StreamWriteTimeout: Duration(time.Hour),
	}
	s, ts := startTestServer(t, cfg)
	p := s.pools["big"]
	tableBytes := int64(8 * p.actor().Identity().Format.BucketCount)
	require.Equal(t, int64(16<<20), tableBytes)
	addr := strings.TrimPrefix(ts.URL, "http://")
	before := heapBytes()
	const slow = 12
	for i := range slow {
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		require.NoError(t, conn.(*net.TCPConn).SetReadBuffer(4096))
		_, err = fmt.Fprintf(conn, "GET /v1/pools/big/stream?consumer=%d&lane=0&epoch=1 HTTP/1.1\r\nHost: relay\r\n\r\n", 100+i)
		require.NoError(t, err)
		// Read only the status line and a little more: the reader is slow.
		line, err := bufio.NewReaderSize(conn, 16).ReadString('\n')
		require.NoError(t, err)
		require.Contains(t, line, "200")
		require.Eventually(t, func() bool { return p.mirror().Stats().Subscribers == i+1 }, 10*time.Second, time.Millisecond)
		// Change the table, so the next subscriber comes after a delta.
		seq := p.mirror().Stats().Sequence
		code, body := post(t, ts.URL+"/v1/pools/big/events?source_epoch=1", "application/json", storedBatchJSON(7, uint64(i+1), 4))
		require.Equal(t, http.StatusAccepted, code, body)
		waitSequence(t, p, seq+1)
	}
	grew := heapBytes() - before
	t.Logf("heap grew %d MiB with %d slow subscribers of a %d MiB table", grew>>20, slow, tableBytes>>20)
	assert.Less(t, grew, 3*tableBytes, "slow subscribers pin a table copy each")
}

// pipeWriter is a ResponseWriter whose body goes into a pipe: a write blocks
// until the test reads it, so the test alone decides how fast the
// subscriber reads.
type pipeWriter struct {
	header http.Header
	pw     *io.PipeWriter
}

func (w *pipeWriter) Header() http.Header         { return w.header }
func (w *pipeWriter) WriteHeader(int)             {}
func (w *pipeWriter) Write(b []byte) (int, error) { return w.pw.Write(b) }
func (w *pipeWriter) Flush()                      {}

// TestStream_SlowLinkConvergesAfterItsSnapshot: a subscriber that reads its
// snapshot slowly while the pool keeps publishing (here 160 deltas per chunk
// it reads, 5,120 over the snapshot's 33 chunks, more than the old per-subscriber queue
// of 4,096) must receive every chunk, then every delta since the snapshot,
// and reach the pool's current state — not be closed lagged as soon as its
// snapshot is done. The interleaving is fixed by the test: the subscriber
// reads through a pipe, and the test publishes a batch after each chunk.
func TestStream_SlowLinkConvergesAfterItsSnapshot(t *testing.T) {
	ts, p, sr := startPipedBigPool(t, 0)
	const perChunk = 160
	seed := uint64(1)
	publish := func() {
		seq := p.mirror().Stats().Sequence
		var evs []string
		for range perChunk {
			evs = append(evs, strings.TrimSuffix(strings.TrimPrefix(storedBatchJSON(7, seed, 1), "["), "]"))
			seed++
		}
		code, body := post(t, ts.URL+"/v1/pools/big/events?source_epoch=1", "application/json", "["+strings.Join(evs, ",")+"]")
		require.Equal(t, http.StatusAccepted, code, body)
		waitSequence(t, p, seq+perChunk)
	}
	chunks := 0
	for {
		require.Equal(t, wire.KindSnapshotChunk, sr.next(), "frame %d", chunks)
		chunks++
		if sr.f.Snapshot.ChunkIndex+1 == sr.f.Snapshot.ChunkCount {
			break
		}
		publish()
	}
	require.Equal(t, 33, chunks) // 2^20 buckets, 32,749 a chunk
	want := p.mirror().Stats().Sequence
	require.GreaterOrEqual(t, want-sr.seq, uint64(32*perChunk))
	for sr.seq < want {
		k := sr.next()
		require.Equal(t, wire.KindDelta, k, "after the snapshot at %d, want deltas up to %d; got %v %+v", sr.seq, want, k, sr.f.Close)
	}
	// The subscriber's table is the pool's: compare with a fresh snapshot.
	fresh, _ := openStream(t, ts.URL, "big", 6, 0, 1)
	for fresh.next() == wire.KindSnapshotChunk && fresh.f.Snapshot.ChunkIndex+1 < fresh.f.Snapshot.ChunkCount {
	}
	require.Equal(t, want, fresh.seq)
	require.Equal(t, fresh.words, sr.words)
	var stored int
	for _, w := range sr.words {
		stored += ckf.Bucket(w).Occupied()
	}
	require.Equal(t, 32*perChunk, stored)
}

// TestStream_LaggedMidSnapshotStopsAtOnce: a subscriber closed lagged while
// its snapshot is still being written gets the close frame next — not the
// rest of a snapshot nobody can use — and its hold on the table goes at
// once.
func TestStream_LaggedMidSnapshotStopsAtOnce(t *testing.T) {
	ts, p, sr := startPipedBigPool(t, 4)
	require.Equal(t, wire.KindSnapshotChunk, sr.next())
	require.Equal(t, uint32(0), sr.f.Snapshot.ChunkIndex)
	seq := p.mirror().Stats().Sequence
	var evs []string
	for i := range 8 {
		evs = append(evs, strings.TrimSuffix(strings.TrimPrefix(storedBatchJSON(7, uint64(i+1), 1), "["), "]"))
	}
	code, body := post(t, ts.URL+"/v1/pools/big/events?source_epoch=1", "application/json", "["+strings.Join(evs, ",")+"]")
	require.Equal(t, http.StatusAccepted, code, body)
	waitSequence(t, p, seq+8)
	require.Eventually(t, func() bool { return p.mirror().Stats().SnapshotBytes == 0 }, 10*time.Second, time.Millisecond,
		"the lagged subscriber still holds its snapshot")
	// The chunk written before the end may still be in the pipe; the
	// close comes right after it.
	k := sr.next()
	if k == wire.KindSnapshotChunk {
		require.Equal(t, uint32(1), sr.f.Snapshot.ChunkIndex)
		k = sr.next()
	}
	require.Equal(t, wire.KindClose, k)
	require.Equal(t, wire.CloseLagged, sr.f.Close.Reason)
}

// startPipedBigPool starts a server with one pool of a 16 MiB table
// ("big", published at every event, 256 KiB frames, no heartbeat or write
// timeout in the way) and one subscriber whose stream the test reads through
// a pipe at its own pace. subscriberQueue 0 keeps the default delta log.
func startPipedBigPool(t *testing.T, subscriberQueue int) (*httptest.Server, *hostedPool, *streamReader) {
	t.Helper()
	cfg := Config{
		Pools:              []PoolSpec{{Name: "big", DCID: 1, ExpectedBlocks: 3_000_000, PublishEveryNEvents: 1}},
		MaxFrameBytes:      256 << 10,
		SubscriberQueue:    subscriberQueue,
		HeartbeatInterval:  Duration(time.Hour),
		StreamWriteTimeout: Duration(time.Hour),
	}
	s, ts := startTestServer(t, cfg)
	return ts, s.pools["big"], pipeStream(t, s, "/v1/pools/big/stream?consumer=5&lane=0&epoch=1")
}

// pipeStream serves a stream request through a pipe the test reads at its
// own pace (the relay's writes block until then); the request ends with the
// test.
func pipeStream(t *testing.T, s *Server, target string) *streamReader {
	t.Helper()
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequest("GET", target, nil).WithContext(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Handler().ServeHTTP(&pipeWriter{header: http.Header{}, pw: pw}, req)
		pw.Close()
	}()
	t.Cleanup(func() { cancel(); pr.Close(); <-done })
	return &streamReader{t: t, r: wire.NewReader(pr, 0)}
}

// TestMetrics_HubMemoryIsVisible: a subscriber parked in its snapshot holds
// a generation, and deltas published meanwhile sit in the shared log; both
// show in /metrics (operators bound them with snapshot_generations and
// subscriber_queue(_bytes)).
func TestMetrics_HubMemoryIsVisible(t *testing.T) {
	ts, p, sr := startPipedBigPool(t, 0)
	require.Equal(t, wire.KindSnapshotChunk, sr.next())
	seq := p.mirror().Stats().Sequence
	code, body := post(t, ts.URL+"/v1/pools/big/events?source_epoch=1", "application/json", storedBatchJSON(7, 1, 1))
	require.Equal(t, http.StatusAccepted, code, body)
	waitSequence(t, p, seq+1)

	resp, err := http.Get(ts.URL + "/metrics")
	require.NoError(t, err)
	metrics, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	hs := p.mirror().Stats()
	require.Equal(t, 1, hs.SnapshotGenerations)
	require.Positive(t, hs.LogDeltas)
	g := func(v int64) string { return strconv.FormatFloat(float64(v), 'g', -1, 64) } // the exposition format's floats
	for _, line := range []string{
		`ckfrelay_hub_snapshot_generations{pool="big"} 1`,
		`ckfrelay_hub_snapshot_bytes{pool="big"} ` + g(hs.SnapshotBytes),
		`ckfrelay_hub_log_deltas{pool="big"} ` + g(int64(hs.LogDeltas)),
		`ckfrelay_hub_log_bytes{pool="big"} ` + g(hs.LogBytes),
	} {
		assert.Contains(t, string(metrics), line)
	}
}
