package demo

import (
	"context"
	"io"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/internal/sim/replay"
	"github.com/ckfrelay/ckfrelay/internal/sim/workload"
)

// demoLoop places the demo's requests: for each, it asks the router for
// every data center's cached prefix, places the request on a data center
// and rank (replay.Placer: cache-aware routing under the latency model),
// scores the router's answer against the fleet's exact truth, serves the
// request on that rank of the fleet and sends the events it emits through
// the data center's feed.
type demoLoop struct {
	o      demoOptions
	relay  *demoRelay
	router *demoRouter
	feeds  []dcFeed
	fleet  *workload.Fleet
	scorer *replay.Scorer
	placer *replay.Placer // cache-aware routing and the latency model
	tick   ticker

	truth, reported     []int // per data center, for the request in hand
	events, eventBlocks uint64
	wall                time.Duration
	model               modelLoad // the load the latency model ran at

	res consumer.QueryResult
	evs []ckf.RouterEvent
}

// arrivals says how requests arrive in the latency model, for the summary.
func newDemoLoop(o demoOptions, relay *demoRelay, router *demoRouter, feeds []dcFeed, stdout io.Writer, arrivals string) (*demoLoop, error) {
	fleet, err := workload.NewFleet(workload.FleetConfig{DataCenters: o.dataCenters, WorkersPerDC: o.workers,
		RanksPerWorker: o.ranks, BlocksPerRank: o.blocksPerRank})
	if err != nil {
		return nil, err
	}
	scorer, err := replay.NewScorer(o.dataCenters, nil) // the pools are behind HTTP: nothing to explain with
	if err != nil {
		return nil, err
	}
	cfg := o.replayConfig()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &demoLoop{o: o, relay: relay, router: router, feeds: feeds, fleet: fleet, scorer: scorer,
		placer: replay.NewPlacer(cfg, fleet),
		model:  modelLoad{arrivals: arrivals, capacity: prefillCapacity(cfg), ranks: o.dataCenters * fleet.Ranks()},
		tick:   ticker{w: stdout, base: relay.base, router: router.Router, dcs: o.dataCenters},
		truth:  make([]int, o.dataCenters), reported: make([]int, o.dataCenters)}, nil
}

// replayConfig is the replay configuration whose routing and latency model
// the demo places requests with: cache-aware, the routers' defaults.
func (o demoOptions) replayConfig() replay.Config {
	cfg := replay.DefaultConfig()
	cfg.DataCenters, cfg.WorkersPerDC, cfg.RanksPerWorker, cfg.BlocksPerRank = o.dataCenters, o.workers, o.ranks, o.blocksPerRank
	cfg.Seed = o.seed
	return cfg
}

// run places requests from src at --rate until --duration passes, the
// source ends or ctx is done (an interrupted demo still reports). It fails
// only when a request cannot be scored or the relay refuses events.
func (l *demoLoop) run(ctx context.Context, src *requestSource) error {
	start := time.Now()
	defer func() { l.wall = time.Since(start) }()
	nextTick := start.Add(time.Second)
	var interval time.Duration
	if l.o.rate > 0 {
		interval = time.Second / time.Duration(l.o.rate)
	}
	deadline := start.Add(l.o.duration)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		req, at, ok := src.Next()
		if !ok {
			return nil // the trace ended
		}
		if err := l.place(ctx, &req, at); err != nil {
			if ctx.Err() != nil {
				return nil // interrupted: still print the summary
			}
			return err
		}
		if now := time.Now(); now.After(nextTick) {
			l.tick.tick(now.Sub(start), l.events, l.eventBlocks, l.scorer)
			nextTick = nextTick.Add(time.Second)
		}
		if interval > 0 {
			if wait := time.Until(start.Add(time.Duration(l.scorer.Requests()) * interval)); wait > 0 {
				time.Sleep(wait)
			}
		}
	}
	return nil
}

// place routes, scores and serves one request arriving in the latency model
// at model time at: its trace timestamp (as in replay) or its synthetic
// Poisson arrival, never the wall clock, so the model's figures do not
// depend on --rate or on how fast this machine runs the loop.
func (l *demoLoop) place(ctx context.Context, req *workload.Request, at time.Duration) error {
	chain := workload.Chain(req.HashIDs)
	locals := make([]uint64, len(req.HashIDs))
	for i, id := range req.HashIDs {
		locals[i] = workload.TokensHash(id)
	}
	t0 := time.Now()
	qerr := l.router.QuerySequenceHashes(chain, &l.res)
	took := time.Since(t0)
	// A lane without an answer reports -1 and is not scored.
	for d := range l.o.dataCenters {
		l.reported[d] = -1
		if qerr == nil && l.res.Mask&(1<<d) != 0 {
			l.reported[d] = int(l.res.Depths[d])
		}
		l.truth[d] = l.fleet.Depth(d, chain)
	}
	chosen := replay.Deepest(l.reported, l.placer.Served()) // the router's answer, scored
	pl := l.placer.Place(int(l.scorer.Requests()), at, req, chain, l.reported)
	if err := l.scorer.Observe(l.truth, l.reported, chosen, pl.DC, len(chain), took); err != nil {
		return err
	}
	l.model.observe(at)
	l.evs = l.fleet.Serve(l.evs[:0], pl.DC, pl.Rank, chain, locals)
	if len(l.evs) == 0 {
		return nil
	}
	// Probed before sending: the relay may publish before Send returns.
	l.router.delivery.probe(l.router.Router, pl.DC, chain[len(chain)-1], time.Now())
	if err := l.feeds[pl.DC].Send(ctx, &servedRequest{rank: pl.Rank, ids: req.HashIDs, locals: locals, evs: l.evs}); err != nil {
		return err
	}
	for i := range l.evs {
		l.events++
		l.eventBlocks += uint64(l.evs[i].BlockCount())
	}
	return nil
}
