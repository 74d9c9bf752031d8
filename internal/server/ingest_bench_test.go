//go:build unix

package server_test

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/internal/server"
	"github.com/ckfrelay/ckfrelay/internal/sim/engine"
	"github.com/ckfrelay/ckfrelay/internal/testing/streamprobe"
	"github.com/ckfrelay/ckfrelay/wire"
	"github.com/stretchr/testify/require"
)

// BenchmarkIngest measures ingest end to end, the same batches through both
// doors of one relay setup: transport=zmq publishes vLLM-format batches from
// an emulated engine's PUB socket to the pool's ZMQ source (which decodes
// them and hashes every block's 16 token ids); transport=http POSTs the same
// events as Dynamo RouterEvent JSON. One op is one batch of 64 Stored events
// × 4 new blocks. A subscribed native consumer reads the pool's stream:
// throughput counts, after a warm-up of as many batches as the timed run,
// until it sees the last batch's block; freshness is from sending a batch to
// the first frame after which the consumer holds its first block.
// transport=pool-apply is the bare apply of the same events, no transport,
// no decode, no actor: Pool.ApplyEvents per batch on a pool configured as
// the relay's (ckf.DefaultApplyWorkers), after the same warm-up, so
// the cost of decode and transport shows beside it.
func BenchmarkIngest(b *testing.B) {
	for _, transport := range []string{"zmq", "http", "pool-apply"} {
		b.Run("transport="+transport, func(b *testing.B) {
			if transport == "pool-apply" {
				benchPoolApply(b)
				return
			}
			benchIngest(b, transport)
		})
	}
}

const eventsPerBatch, blocksPerEvent, blockSize = 64, 4, 16

// ingestCPUProfile, when set, is a file that receives a CPU profile of the
// timed part of BenchmarkIngest only: -test.cpuprofile would be dominated by
// the batches' construction before the timer starts. Measurement only.
var ingestCPUProfile = flag.String("ingest.cpuprofile", "", "write a CPU profile of BenchmarkIngest's timed part to this file")

// reportCPUPerBlock reports the process's CPU time (user + system, every
// goroutine: engine, relay and consumer) per block of the timed part. On
// this shared machine wall-clock rates swing with the load of other jobs;
// CPU per block swings far less, so a change is compared by it.
func reportCPUPerBlock(b *testing.B, cpu time.Duration) {
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*eventsPerBatch*blocksPerEvent), "cpu-ns/block")
}

// profileTimed starts the timed part's CPU profile when asked; the returned
// function stops it.
func profileTimed(b *testing.B) func() {
	if *ingestCPUProfile == "" {
		return func() {}
	}
	f, err := os.Create(*ingestCPUProfile)
	require.NoError(b, err)
	require.NoError(b, pprof.StartCPUProfile(f))
	return func() {
		pprof.StopCPUProfile()
		require.NoError(b, f.Close())
	}
}

// ingestBatch returns one batch of the ingest benchmark: chained Stored
// events of worker 1, tokens distinct per block (counted up from *next), as
// engine events and as RouterEvents, and the canonical hash of its first
// block.
func ingestBatch(next *uint32) (evs []engine.Event, revs []ckf.RouterEvent, first uint64) {
	for i := range eventsPerBatch {
		var ev engine.Event
		rev := ckf.RouterEvent{WorkerID: 1, EventID: uint64(*next), Kind: ckf.EventStored}
		var prev uint64
		for j := range blocksPerEvent {
			toks := make([]uint32, blockSize)
			for k := range toks {
				*next++
				toks[k] = *next
			}
			local := ckf.LocalBlockHash(toks, ckf.BaseSalt)
			canon := local
			if j > 0 {
				canon = ckf.ChainHash(prev, local)
			}
			if i == 0 && j == 0 {
				first = canon
			}
			prev = canon
			h := uint64(*next)<<8 | 1
			ev.BlockHashes = append(ev.BlockHashes, h)
			ev.TokenIDs = append(ev.TokenIDs, toks...)
			rev.Blocks = append(rev.Blocks, ckf.StoredBlock{BlockHash: h, TokensHash: local})
		}
		ev.Type = "BlockStored"
		evs = append(evs, ev)
		revs = append(revs, rev)
	}
	return evs, revs, first
}

func benchPoolApply(b *testing.B) {
	pc := ckf.DefaultConfig()
	pc.ExpectedBlocks = 1 << 22
	pc.PublishEveryNEvents = server.DefaultPublishEveryN
	pc.ApplyWorkers = ckf.DefaultApplyWorkers()
	pool, err := ckf.NewPool(pc.WithSizedLimits())
	require.NoError(b, err)
	var next uint32
	batches := make([][]ckf.RouterEvent, 2*b.N)
	for i := range batches {
		_, batches[i], _ = ingestBatch(&next)
	}
	var outs []ckf.ApplyOutcome
	apply := func(evs []ckf.RouterEvent) {
		outs = pool.ApplyEvents(outs[:0], evs)
		for _, o := range outs {
			if o.FirstError != nil {
				require.Fail(b, fmt.Sprint(o.FirstError))
			}
		}
	}
	for _, evs := range batches[:b.N] { // the warm-up of the other transports
		apply(evs)
	}
	runtime.GC()
	stopProfile := profileTimed(b)
	cpu0 := cpuTime()
	b.ResetTimer()
	for _, evs := range batches[b.N:] {
		apply(evs)
	}
	b.StopTimer()
	cpu := cpuTime() - cpu0
	stopProfile()
	reportCPUPerBlock(b, cpu)
	b.ReportMetric(float64(b.N*eventsPerBatch)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(b.N*eventsPerBatch*blocksPerEvent)/b.Elapsed().Seconds(), "blocks/s")
}

func benchIngest(b *testing.B, transport string) {
	base, err := engine.FreePorts(2)
	require.NoError(b, err)
	pub, rep := fmt.Sprintf("tcp://127.0.0.1:%d", base), fmt.Sprintf("tcp://127.0.0.1:%d", base+1)
	// A deep subscriber queue: the burst must not drop the consumer into
	// re-snapshots, which would measure slow-subscriber recovery instead.
	cfg := server.Config{Pools: []server.PoolSpec{{Name: "p", DCID: 1, ExpectedBlocks: 1 << 22}}, SubscriberQueue: 1 << 16}
	var eng *engine.Engine
	if transport == "zmq" {
		eng, err = engine.Start(engine.Config{Endpoint: pub, Replay: rep, BlockSize: blockSize, BufferSteps: 1 << 20})
		require.NoError(b, err)
		defer eng.Close()
		cfg.Pools[0].Sources = []server.SourceSpec{{Engine: "vllm", Endpoint: pub, Replay: rep, Worker: 1, BlockSize: blockSize}}
	}
	r := startBenchRelay(b, cfg, slog.New(slog.DiscardHandler))
	defer r.stop()
	url := r.url

	// The subscriber: a native consumer applying every frame.
	c, err := consumer.New(r.m)
	require.NoError(b, err)
	probe := streamprobe.New(c)
	resp, err := http.Get(url + "/v1/pools/p/stream?consumer=100&lane=0&epoch=1")
	require.NoError(b, err, "subscribe")
	require.Equal(b, http.StatusOK, resp.StatusCode, "subscribe")
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer resp.Body.Close()
		_ = probe.Run(resp.Body) // ends with the relay's shutdown
	}()
	<-probe.Ready()
	visible := probe.Visible

	// Batches: chained Stored events; tokens distinct per block.
	var next uint32
	type batch struct {
		payload []byte // zmq
		body    []byte // http
		first   uint64 // canonical hash of the batch's first block
	}
	makeBatch := func() batch {
		var bt batch
		evs, revs, first := ingestBatch(&next)
		bt.first = first
		if transport == "zmq" {
			bt.payload, _ = eng.EncodeBatch(evs...)
		} else {
			bt.body, _ = wire.AppendRouterEventsJSON(nil, revs)
		}
		return bt
	}
	// Warm up: the source is connected and live before timing.
	if transport == "zmq" {
		w := makeBatch()
		deadline := time.Now().Add(10 * time.Second)
		for !visible(w.first) {
			if time.Now().After(deadline) {
				require.FailNow(b, "the zmq source never delivered a batch")
			}
			require.NoError(b, eng.PublishEncoded(w.payload))
			time.Sleep(10 * time.Millisecond)
		}
	}
	const paced = 200 // freshness samples, one batch in flight at a time
	// Warm-up: as many batches as the timed run, first. The figure is the
	// ingest rate of a relay that has been ingesting (its heap grown to its
	// working size, its maps past their first growths), not of a process in
	// its first second, where every allocation faults in a fresh page;
	// BENCHMARKS.md ("Engine ingest") gives both.
	warmup := b.N
	batches := make([]batch, warmup+b.N+paced)
	for i := range batches {
		batches[i] = makeBatch()
	}
	hc := &http.Client{}
	send := func(bt *batch) {
		if transport == "zmq" {
			if err := eng.PublishEncoded(bt.payload); err != nil {
				require.Fail(b, fmt.Sprint(err))
			}
		} else {
			resp, err := hc.Post(url+"/v1/pools/p/events?source_epoch=1", "application/json", bytes.NewReader(bt.body))
			if err != nil {
				require.Fail(b, fmt.Sprint(err))
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusAccepted {
				require.Fail(b, fmt.Sprintf("events: %s", resp.Status))
			}
		}
	}
	waitVisible := func(key uint64, what string) {
		deadline := time.Now().Add(30 * time.Second)
		for !visible(key) {
			if time.Now().After(deadline) {
				require.FailNow(b, what+" never reached the consumer")
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	for i := range warmup {
		send(&batches[i])
	}
	waitVisible(batches[warmup-1].first, "the last warm-up batch")
	runtime.GC()
	stopProfile := profileTimed(b)
	cpu0 := cpuTime()
	b.ResetTimer()
	start := time.Now()
	for i := warmup; i < warmup+b.N; i++ {
		send(&batches[i])
	}
	waitVisible(batches[warmup+b.N-1].first, "the last batch")
	elapsed := time.Since(start)
	b.StopTimer()
	cpu := cpuTime() - cpu0
	stopProfile()
	reportCPUPerBlock(b, cpu)
	b.ReportMetric(float64(b.N*eventsPerBatch)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(b.N*eventsPerBatch*blocksPerEvent)/elapsed.Seconds(), "blocks/s")
	// Freshness, paced: send one batch, wait until the consumer holds it.
	for i := warmup + b.N; i < len(batches); i++ {
		measured := probe.Measured()
		if !probe.Probe(batches[i].first, time.Now()) { // no testify call between the probe's clock and the send
			require.Fail(b, "a probe was still pending")
		}
		send(&batches[i])
		deadline := time.Now().Add(10 * time.Second)
		for probe.Measured() == measured {
			if time.Now().After(deadline) {
				require.FailNow(b, "a paced batch never reached the consumer")
			}
			time.Sleep(20 * time.Microsecond) // the reader takes the time, not this loop
		}
	}
	if s, p50, p99 := probe.Freshness(); len(s) > 0 {
		b.ReportMetric(float64(p50.Nanoseconds()), "fresh-p50-ns")
		b.ReportMetric(float64(p99.Nanoseconds()), "fresh-p99-ns")
		b.ReportMetric(float64(len(s)), "fresh-samples")
	}
	if transport == "zmq" {
		st := r.srv.SourceStatuses("p")
		require.Zero(b, st[0].Gaps+st[0].Rejected+st[0].Degraded, "the zmq source lost batches: %+v", st[0])
	}
}
