package demo

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/server"
	"github.com/ckfrelay/ckfrelay/internal/sim/engine"
)

// zmqDemoDC is the data center whose engines publish over ZMQ in the demo
// (the others post to the relay's HTTP ingest).
const zmqDemoDC = 0

// zmqDemoBlockSize is two tokens per block: a block's two token ids are the
// low and high halves of its trace block id, so SPEC §3's local block hash
// the relay computes from them (XXH3-64 of the little-endian u32 tokens,
// seed 1337) is exactly workload.TokensHash of the id, and the router's
// queries find what the engines stored.
const zmqDemoBlockSize = 2

// zmqDemo makes one data center hear its fleet the way production does:
// every rank of every worker is an emulated engine (a real ZMQ PUB socket
// and a replay ROUTER socket on loopback, sending vLLM's wire format and a
// heartbeat every second), and the pool has one vllm source per worker with
// dp_ranks = ranks per worker, at vLLM's port layout.
type zmqDemo struct {
	ranksPerWorker int
	engines        []*engine.Engine // by fleet rank index
	stops          []func()
	ids            map[uint64]uint64 // tokens hash → trace block id, per Publish
	sources        []server.SourceSpec
}

// newZMQDemo starts the engines; Configure adds their sources to the pool.
func newZMQDemo(o demoOptions, stdout io.Writer) (*zmqDemo, error) {
	z := &zmqDemo{ranksPerWorker: o.ranks, ids: map[uint64]uint64{}}
	stride := 2 * o.ranks
	base, err := engine.FreePorts(o.workers * stride)
	if err != nil {
		return nil, err
	}
	for w := range o.workers {
		pub := fmt.Sprintf("tcp://127.0.0.1:%d", base+w*stride)
		rep := fmt.Sprintf("tcp://127.0.0.1:%d", base+w*stride+o.ranks)
		for r := range o.ranks {
			e, err := engine.Start(engine.Config{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base+w*stride+r),
				Replay: fmt.Sprintf("tcp://127.0.0.1:%d", base+w*stride+o.ranks+r), DPRank: uint32(r),
				BlockSize: zmqDemoBlockSize, PublisherID: true, Form: engine.Form(w % 2), Seed: uint64(w*o.ranks + r)})
			if err != nil {
				z.Close()
				return nil, err
			}
			z.engines = append(z.engines, e)
			z.stops = append(z.stops, e.HeartbeatEvery(time.Second))
		}
		z.sources = append(z.sources, server.SourceSpec{Engine: "vllm",
			Endpoint: pub, Replay: rep, DPRanks: o.ranks, Worker: uint64(zmqDemoDC*1000 + w), BlockSize: zmqDemoBlockSize})
	}
	fmt.Fprintf(stdout, "dc-%d hears its %d engines over ZMQ (vLLM wire format, replay sockets) at 127.0.0.1:%d..%d; the others post over HTTP\n",
		zmqDemoDC, len(z.engines), base, base+o.workers*stride-1)
	return z, nil
}

// Configure subscribes the data center's pool to its engines.
func (z *zmqDemo) Configure(_ int, spec *server.PoolSpec) {
	spec.Sources = append(spec.Sources, z.sources...)
}

// Open does nothing: the relay connects to the engines itself.
func (z *zmqDemo) Open(context.Context, string) error { return nil }

// Send publishes the events a rank emitted serving a request, as its engine
// would: one batch, token ids instead of token hashes.
func (z *zmqDemo) Send(_ context.Context, s *servedRequest) error {
	return z.publish(s.rank, s.evs, s.ids, s.locals)
}

// publish sends the events rank r emitted serving a request whose trace
// block ids are ids (local hashes locals).
func (z *zmqDemo) publish(r int, evs []ckf.RouterEvent, ids, locals []uint64) error {
	clear(z.ids)
	for i, l := range locals {
		z.ids[l] = ids[i]
	}
	out := make([]engine.Event, 0, len(evs))
	for _, ev := range evs {
		switch ev.Kind {
		case ckf.EventRemoved:
			out = append(out, engine.Event{Type: "BlockRemoved", BlockHashes: ev.BlockHashes})
		case ckf.EventStored:
			e := engine.Event{Type: "BlockStored", HasParent: ev.HasParent, Parent: ev.ParentHash}
			for _, b := range ev.Blocks {
				id, ok := z.ids[b.TokensHash]
				if !ok {
					return fmt.Errorf("demo: block %#x has no trace id", b.TokensHash)
				}
				e.BlockHashes = append(e.BlockHashes, b.BlockHash)
				e.TokenIDs = append(e.TokenIDs, uint32(id), uint32(id>>32))
			}
			out = append(out, e)
		}
	}
	return z.engines[r].Publish(out...)
}

// Close stops the engines.
func (z *zmqDemo) Close() error {
	for _, stop := range z.stops {
		stop()
	}
	for _, e := range z.engines {
		_ = e.Close()
	}
	return nil
}
