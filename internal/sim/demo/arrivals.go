package demo

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"time"

	"github.com/ckfrelay/ckfrelay/internal/sim/replay"
	"github.com/ckfrelay/ckfrelay/internal/sim/workload"
)

// The demo runs two clocks. The wall clock paces the relay, the router and
// the feeds (--rate): it measures them. The latency model's clock is when
// requests arrive at the modelled fleet: a trace's timestamps, or for the
// synthetic workload a Poisson process at --model-rate, whose default offers
// --model-load of the fleet's prefill capacity. Tying the model to the wall
// clock would offer the fleet whatever the demo's loop happens to place per
// second (thousands), far past what its ranks compute, and report an
// unbounded queue instead of routing (docs/RATIONALE.md, "Why does the demo
// model its own arrivals?").

// defaultModelLoad is the share of the modelled fleet's prefill capacity the
// synthetic workload's prompts offer by default: busy, with headroom, as a
// production fleet is sized.
const defaultModelLoad = 0.7

// The model flags' bounds: below one request per 100 s the model is idle;
// above a million a second, or ten times the fleet's capacity, it is only a
// queue growing (what the wall clock used to offer).
const (
	minModelRate = 0.01
	maxModelRate = 1e6
	maxModelLoad = 10.0
)

// promptSample is how many synthetic requests are drawn to measure the
// workload's mean prompt (its mean is flat from the first request on: ≈ 20
// blocks under the demo's shape).
const promptSample = 4096

// syntheticConfig is the demo's synthetic workload.
func (o demoOptions) syntheticConfig() workload.SyntheticConfig {
	return workload.SyntheticConfig{SystemPrompts: 64, PromptBlocks: 8, ZipfS: 1.2,
		Conversations: 256 * o.dataCenters, TurnBlocks: 4, MaxTurns: 8, ContinueChance: 0.7, Seed: o.seed}
}

// promptTokens returns the prompt tokens the latency model charges a
// request without a cached block: its input length, or whole blocks when a
// trace has none.
func promptTokens(lat replay.Latency, req *workload.Request) int64 {
	if req.InputLength > 0 {
		return req.InputLength
	}
	return int64(len(req.HashIDs)) * int64(lat.BlockTokens)
}

// meanPromptTokens returns the mean prompt tokens of the first n requests of
// a synthetic workload with cfg.
func meanPromptTokens(lat replay.Latency, cfg workload.SyntheticConfig, n int) float64 {
	g := workload.NewSynthetic(cfg)
	var sum int64
	for range n {
		req := g.Next()
		sum += promptTokens(lat, &req)
	}
	return float64(sum) / float64(n)
}

// prefillCapacity returns the modelled fleet's prefill throughput: every
// rank of every data center, in tokens per second.
func prefillCapacity(cfg replay.Config) float64 {
	return float64(cfg.DataCenters*cfg.WorkersPerDC*cfg.RanksPerWorker) * cfg.Latency.PrefillTokensPerSec
}

// arrivalRate returns the synthetic workload's arrival rate in the latency
// model, in requests per second of model time, and how it was chosen:
// --model-rate when set, else --model-load of the fleet's prefill capacity
// over the workload's mean prompt (as if nothing were cached, so that
// every policy, cache-blind ones included, faces a load the fleet serves).
func (o demoOptions) arrivalRate() (float64, string) {
	if o.modelRate > 0 {
		return o.modelRate, "--model-rate"
	}
	cfg := o.replayConfig()
	mean := meanPromptTokens(cfg.Latency, o.syntheticConfig(), promptSample)
	return o.modelLoad * prefillCapacity(cfg) / mean,
		fmt.Sprintf("%.0f%% of the fleet's prefill capacity over a mean prompt of %.0f tokens", 100*o.modelLoad, mean)
}

// poissonArrivals stamps requests with arrival times of a Poisson process:
// exponential gaps at a rate per second, from its own seeded generator so
// that the model's arrivals do not depend on the wall clock.
type poissonArrivals struct {
	rng  *rand.Rand
	rate float64
	at   time.Duration
}

func newPoissonArrivals(rate float64, seed uint64) *poissonArrivals {
	return &poissonArrivals{rng: rand.New(rand.NewPCG(seed, 0xA441_7A15)), rate: rate}
}

// next returns the next arrival time. It saturates at the longest
// duration rather than wrap (a demo would run for years of model time first).
func (a *poissonArrivals) next() time.Duration {
	gap := a.rng.ExpFloat64() / a.rate * float64(time.Second)
	if gap >= float64(math.MaxInt64-a.at) {
		a.at = math.MaxInt64
	} else {
		a.at += time.Duration(gap)
	}
	return a.at
}

// modelLoad is the load the latency model ran at, measured from the
// arrivals it saw, for the summary: what makes its TTFT interpretable.
type modelLoad struct {
	arrivals    string  // how requests arrived in the model
	capacity    float64 // the fleet's prefill tokens per second
	ranks       int
	first, last time.Duration
	n           uint64
}

// observe records one request's arrival in the model.
func (m *modelLoad) observe(at time.Duration) {
	if m.n == 0 {
		m.first = at
	}
	m.last = at
	m.n++
}

// rate returns the measured arrival rate and the model time it spans; 0
// with fewer than two arrivals or none apart.
func (m *modelLoad) rate() (perSec float64, span time.Duration) {
	span = m.last - m.first
	if m.n < 2 || span <= 0 {
		return 0, span
	}
	return float64(m.n-1) / span.Seconds(), span
}

// utilisation returns the share of the fleet's prefill capacity the
// requests' whole prompts offered and the share their uncached prompts
// (what the ranks computed under the policy) used; 0 when unmeasurable.
func (m *modelLoad) utilisation(rep *replay.Report) (prompt, computed float64) {
	perSec, _ := m.rate()
	if perSec == 0 || rep.Requests == 0 || m.capacity <= 0 {
		return 0, 0
	}
	perReq := perSec / float64(rep.Requests) / m.capacity // per token of the run's total
	return float64(rep.PrefillTokens+rep.PrefillTokensSaved) * perReq, float64(rep.PrefillTokens) * perReq
}

// print writes the summary's lines on the model's load.
func (m *modelLoad) print(w io.Writer, rep *replay.Report) {
	perSec, span := m.rate()
	prompt, computed := m.utilisation(rep)
	fmt.Fprintf(w, "  latency model: arrivals %s; measured %.1f req/s over %.1f s of model time (wall clock placed %.0f req/s)\n",
		m.arrivals, perSec, span.Seconds(), float64(rep.Requests)/max(rep.WallSeconds, 1e-9))
	fmt.Fprintf(w, "  model load: prompts offered %.1f%% of the fleet's prefill capacity (%d ranks × %.0f tokens/s); computed after cache hits %.1f%%\n",
		100*prompt, m.ranks, m.capacity/float64(max(m.ranks, 1)), 100*computed)
}
