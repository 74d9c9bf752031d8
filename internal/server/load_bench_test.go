package server_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/internal/server"
	"github.com/ckfrelay/ckfrelay/internal/testing/streamprobe"
	"github.com/ckfrelay/ckfrelay/wire"
	"github.com/stretchr/testify/require"
)

// BenchmarkRelayLoad posts batches of Stored events (64 events × 4 new blocks)
// over loopback HTTP into one relay pool while 16 remote subscribers read the
// pool's stream (timing starts once every one holds its snapshot); one of
// them applies every frame to a native consumer and measures freshness: from
// sending the POST to the first frame after which the consumer's filter holds
// the batch's first block. One op is one batch.
func BenchmarkRelayLoad(b *testing.B) {
	const subscribers, eventsPerBatch, blocksPerEvent = 16, 64, 4
	cfg := server.Config{Pools: []server.PoolSpec{{Name: "p", DCID: 1, ExpectedBlocks: 1 << 22}}}
	r := startBenchRelay(b, cfg, nil)
	defer r.stop() // every stream ends with the shutdown
	base := r.url

	c, err := consumer.New(r.m)
	require.NoError(b, err)
	probe := streamprobe.New(c)
	ready := make(chan struct{}, subscribers)
	for i := range subscribers {
		resp, err := http.Get(fmt.Sprintf("%s/v1/pools/p/stream?consumer=%d&lane=0&epoch=1", base, 100+i))
		require.NoError(b, err, "subscriber %d", i)
		require.Equal(b, http.StatusOK, resp.StatusCode, "subscriber %d", i)
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			defer resp.Body.Close()
			if i > 0 { // a plain subscriber: take its snapshot, then read and drop
				fr := wire.NewReader(resp.Body, 0)
				var f wire.Frame
				for {
					body, err := fr.ReadRaw()
					if err != nil {
						ready <- struct{}{}
						return
					}
					if wire.DecodeFrameView(body, &f) == nil && f.Kind == wire.KindSnapshotChunk &&
						f.Snapshot.ChunkIndex+1 == f.Snapshot.ChunkCount {
						break
					}
				}
				ready <- struct{}{}
				for _, err := fr.ReadRaw(); err == nil; _, err = fr.ReadRaw() {
				}
				return
			}
			go func() { <-probe.Ready(); ready <- struct{}{} }()
			_ = probe.Run(resp.Body) // ends with the relay's shutdown
		}()
	}
	for range subscribers {
		<-ready
	}

	hc := &http.Client{}
	var body []byte
	evs := make([]ckf.RouterEvent, eventsPerBatch)
	var next uint64
	b.ResetTimer()
	start := time.Now()

	for range b.N {
		var firstLocal uint64
		for i := range evs {
			next++
			ev := ckf.RouterEvent{WorkerID: next % 8, EventID: next, Kind: ckf.EventStored, Blocks: evs[i].Blocks[:0]}
			for j := range blocksPerEvent {
				local := next*1_000_003 + uint64(j)
				if i == 0 && j == 0 {
					firstLocal = local
				}
				ev.Blocks = append(ev.Blocks, ckf.StoredBlock{BlockHash: next<<8 | uint64(j), TokensHash: local})
			}
			evs[i] = ev
		}
		body, _ = wire.AppendRouterEventsJSON(body[:0], evs)
		// Probed before the POST: its deltas may reach the consumer before
		// the 202 reaches us. One probe in flight at a time.
		probe.Probe(ckf.AppendSequenceHashes(nil, []uint64{firstLocal})[0], time.Now())
		resp, err := hc.Post(base+"/v1/pools/p/events?source_epoch=1", "application/json", bytes.NewReader(body))
		if err != nil {
			require.Fail(b, fmt.Sprint(err))
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			require.Fail(b, fmt.Sprintf("events: %s", resp.Status))
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()

	b.ReportMetric(float64(b.N*eventsPerBatch)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(b.N*eventsPerBatch*blocksPerEvent)/elapsed.Seconds(), "blocks/s")
	// Let the last probe land before reading the samples.
	deadline := time.Now().Add(5 * time.Second)
	for !probe.Idle() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if s, p50, p99 := probe.Freshness(); len(s) > 0 {
		b.ReportMetric(float64(p50.Nanoseconds()), "fresh-p50-ns")
		b.ReportMetric(float64(p99.Nanoseconds()), "fresh-p99-ns")
		b.ReportMetric(float64(len(s)), "fresh-samples")
	}
}
