package replay

import (
	"math/rand/v2"
	"slices"
	"time"

	"github.com/ckfrelay/ckfrelay/internal/sim/workload"
)

// seriesWindow is the number of requests per point of [Report.Series].
const seriesWindow = 100

// Placement is where a [Placer] served a request and what the latency model
// says it cost.
type Placement struct {
	DC, Rank  int
	RankDepth int           // leading blocks the rank had cached
	Prefill   int64         // prompt tokens the rank computed
	Queue     time.Duration // waiting for the rank's earlier prefills
	TTFT      time.Duration // round trip + queue + prefill
	Remote    bool          // served outside the request's origin data center
}

// Placer places requests on a fleet's ranks by a [Policy] and runs the
// [Latency] model: it is the router of [Run] and of `relay demo`. Call
// [Placer.Place] before the fleet serves the request (it reads the ranks'
// cached prefixes), in arrival order. Not safe for concurrent use.
type Placer struct {
	policy  Policy
	routing Routing
	lat     Latency
	fleet   *workload.Fleet
	rng     *rand.Rand
	dcs     int
	ranks   int

	queues     [][]rankQueue
	served     []uint64 // requests per data center
	rankServed []uint64 // requests per rank, flat [dc*ranks+rank]

	// scratch
	costs     []float64
	rankCosts []float64
	active    []int
	depth     []int
	zeros     []int

	// figures
	ttft, queue       []int64
	inputTokens       int64
	prefillTokens     int64
	requestBlocks     uint64
	rankHits          uint64
	remote            uint64
	window            []uint64 // requests per rank in the current window
	windowHit, winBlk uint64
	series            []SeriesPoint
}

// NewPlacer returns a placer for fleet under cfg's policy, routing and
// latency model (cfg must be valid: [Config.Validate]).
func NewPlacer(cfg Config, fleet *workload.Fleet) *Placer {
	d, r := fleet.Config().DataCenters, fleet.Ranks()
	p := &Placer{policy: cfg.Policy, routing: cfg.Routing, lat: cfg.Latency, fleet: fleet,
		rng: rand.New(rand.NewPCG(cfg.Seed, 0x5EED)), dcs: d, ranks: r,
		served: make([]uint64, d), rankServed: make([]uint64, d*r), window: make([]uint64, d*r),
		costs: make([]float64, d), rankCosts: make([]float64, r), active: make([]int, r),
		depth: make([]int, r), zeros: make([]int, max(d, r))}
	p.queues = make([][]rankQueue, d)
	for i := range p.queues {
		p.queues[i] = make([]rankQueue, r)
	}
	return p
}

// Served returns the requests served per data center so far (the
// tie-break load of [Deepest]); the slice is the placer's.
func (p *Placer) Served() []uint64 { return p.served }

// Place picks the data center and rank for the i-th request (0-based),
// arriving at trace time at with canonical chain, given the router's
// reported depth per data center, and runs it through the latency model.
func (p *Placer) Place(i int, at time.Duration, req *workload.Request, chain []uint64, reported []int) Placement {
	origin := i % p.dcs
	var d, r int
	switch p.policy {
	case Random:
		d, r = p.rng.IntN(p.dcs), p.rng.IntN(p.ranks)
	case RoundRobin:
		d, r = i%p.dcs, (i/p.dcs)%p.ranks
	case Affinity:
		d = Deepest(reported, p.served)
		p.rankDepths(d, chain)
		r = Deepest(p.depth, p.rankServed[d*p.ranks:(d+1)*p.ranks])
	default: // CacheAware, LoadOnly
		if p.policy == LoadOnly {
			reported = p.zeros[:p.dcs]
		}
		d = p.chooseDC(origin, at, req, reported)
		if p.policy == LoadOnly {
			clear(p.depth)
		} else {
			p.rankDepths(d, chain)
		}
		r = p.chooseRank(d, at, req, p.depth)
	}
	return p.serve(origin, d, r, at, req, chain)
}

// rankDepths fills p.depth with each rank of d's cached prefix of chain.
func (p *Placer) rankDepths(d int, chain []uint64) {
	for r := range p.ranks {
		p.depth[r] = p.fleet.RankDepth(d, r, chain)
	}
}

// cost is Dynamo's logit for a rank at trace time at: weighted prefill
// blocks (queued plus the request's uncached tokens) plus decode blocks
// (active plus the request's), plus the round trip as the prefill blocks
// one could compute meanwhile.
func (p *Placer) cost(q *rankQueue, at time.Duration, req *workload.Request, blocks, depth int, rtt time.Duration) (float64, int) {
	pending, active, n := q.load(at)
	bt := float64(p.lat.BlockTokens)
	prefill := float64(pending+p.lat.uncached(req.InputLength, blocks, depth)) / bt
	decode := float64(active) + float64(blocks)
	wait := rtt.Seconds() * p.lat.PrefillTokensPerSec / bt
	return p.routing.OverlapWeight*(prefill+wait) + decode, n
}

// chooseDC is the global router's choice: each data center scored by its
// cheapest rank's cost at the data center's reported depth, with the round
// trip from the request's origin.
func (p *Placer) chooseDC(origin int, at time.Duration, req *workload.Request, reported []int) int {
	blocks := len(req.HashIDs)
	for d := range p.dcs {
		best := -1.0
		for r := range p.ranks {
			c, _ := p.cost(&p.queues[d][r], at, req, blocks, max(reported[d], 0), p.lat.rtt(origin, d))
			if best < 0 || c < best {
				best = c
			}
		}
		p.costs[d] = best
	}
	return p.routing.pick(p.costs, p.rng)
}

// chooseRank is the data center's router: SGLang's guard on the ranks'
// active requests, else Dynamo's cost at each rank's exact cached depth.
func (p *Placer) chooseRank(d int, at time.Duration, req *workload.Request, depth []int) int {
	for r := range p.ranks {
		p.rankCosts[r], p.active[r] = p.cost(&p.queues[d][r], at, req, len(req.HashIDs), depth[r], 0)
	}
	if p.routing.imbalanced(p.active) {
		best := 0
		for r, a := range p.active {
			if a < p.active[best] {
				best = r
			}
		}
		return best
	}
	return p.routing.pick(p.rankCosts, p.rng)
}

// serve runs the request on rank r of d in the latency model and records it.
func (p *Placer) serve(origin, d, r int, at time.Duration, req *workload.Request, chain []uint64) Placement {
	blocks := len(chain)
	depth := p.fleet.RankDepth(d, r, chain)
	tokens := p.lat.uncached(req.InputLength, blocks, depth)
	rtt := p.lat.rtt(origin, d)
	arrive := at + rtt/2
	start, end := p.queues[d][r].admit(arrive, job{prefill: tokens, blocks: int64(blocks)},
		p.lat.prefill(tokens), p.lat.decode(req.OutputLength))
	pl := Placement{DC: d, Rank: r, RankDepth: depth, Prefill: tokens, Queue: start - arrive,
		TTFT: end + rtt - rtt/2 - at, Remote: d != origin}

	p.served[d]++
	p.rankServed[d*p.ranks+r]++
	p.ttft = append(p.ttft, int64(pl.TTFT))
	p.queue = append(p.queue, int64(pl.Queue))
	p.inputTokens += p.lat.uncached(req.InputLength, blocks, 0)
	p.prefillTokens += tokens
	p.requestBlocks += uint64(blocks)
	p.rankHits += uint64(depth)
	if pl.Remote {
		p.remote++
	}
	p.window[d*p.ranks+r]++
	p.windowHit += uint64(depth)
	p.winBlk += uint64(blocks)
	if n := len(p.ttft); n%seriesWindow == 0 {
		p.series = append(p.series, SeriesPoint{Requests: uint64(n), TraceSeconds: at.Seconds(),
			RankHitRatePct: pct(p.windowHit, p.winBlk), RankImbalance: imbalance(p.window)})
		clear(p.window)
		p.windowHit, p.winBlk = 0, 0
	}
	return pl
}

// SeriesPoint is one window of [seriesWindow] requests of [Report.Series].
type SeriesPoint struct {
	Requests       uint64  `json:"requests"` // at the window's end
	TraceSeconds   float64 `json:"trace_seconds"`
	RankHitRatePct float64 `json:"rank_hit_rate_pct"` // in the window
	RankImbalance  float64 `json:"rank_imbalance"`    // in the window: max/mean requests per rank
}

// imbalance returns max/mean of counts (0 when all are 0).
func imbalance(counts []uint64) float64 {
	var sum, top uint64
	for _, c := range counts {
		sum += c
		top = max(top, c)
	}
	if sum == 0 {
		return 0
	}
	return float64(top) * float64(len(counts)) / float64(sum)
}

func pct(a, b uint64) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

// Fill writes the placer's figures into r: TTFT and queueing percentiles,
// the TTFT CDF, rank imbalance, prefill tokens saved, the rank hit rate,
// remote placements and the series.
func (p *Placer) Fill(r *Report) {
	ms := func(ns int64) float64 { return float64(ns) / 1e6 }
	r.TTFTP50Ms, r.TTFTP90Ms, r.TTFTP99Ms = ms(Percentile(p.ttft, 0.50)), ms(Percentile(p.ttft, 0.90)), ms(Percentile(p.ttft, 0.99))
	r.TTFTMeanMs, r.QueueMeanMs = ms(mean(p.ttft)), ms(mean(p.queue))
	r.QueueP50Ms, r.QueueP99Ms = ms(Percentile(p.queue, 0.50)), ms(Percentile(p.queue, 0.99))
	r.RankImbalance = imbalance(p.rankServed)
	r.PrefillTokens = p.prefillTokens
	r.PrefillTokensSaved = p.inputTokens - p.prefillTokens
	if p.inputTokens > 0 {
		r.PrefillSavedPct = 100 * float64(r.PrefillTokensSaved) / float64(p.inputTokens)
	}
	r.RankHitRatePct = pct(p.rankHits, p.requestBlocks)
	r.RemotePct = pct(p.remote, uint64(len(p.ttft)))
	r.Series = slices.Clone(p.series)
	r.TTFTCDFMs = nil
	if len(p.ttft) > 0 {
		s := slices.Clone(p.ttft)
		slices.Sort(s)
		for q := range 101 {
			r.TTFTCDFMs = append(r.TTFTCDFMs, ms(s[min(len(s)-1, q*len(s)/100)]))
		}
	}
}

func mean(ns []int64) int64 {
	if len(ns) == 0 {
		return 0
	}
	var s float64
	for _, v := range ns {
		s += float64(v)
	}
	return int64(s / float64(len(ns)))
}
