// Package replay drives ckfrelay with a request trace and measures how well
// its router picks the data center that really holds each request's prefix.
//
// A replay is one process and one goroutine: D data centers, each a
// workload.Fleet data center (W workers × R ranks with LRU caches) whose
// events go straight into one [ckf.Pool] and its [producer.Publisher]; every
// delta and snapshot is encoded with package wire and applied, as bytes, to
// one consumer (native or WebAssembly, see [Config.NewConsumer]) holding a
// lane per data center. The exact ground truth (which canonical blocks each
// data center holds at query time) comes from the fleet, so every routed
// request is scored against it.
//
// Time is the trace's clock. A pool publishes at its event cadence
// ([Config.PublishEveryNEvents]) or when its publication timer
// ([Config.PublicationDelay]) expires, and a published delta becomes visible
// to the router [Config.Lag] later; until then its events are "in flight".
// Because the harness knows exactly which events are in flight and which
// blocks a pool omitted for capacity, it proves every depth under-report is
// explained by one of the two ([Report.UnexplainedUnderReports] must be 0).
// With [Config.Exact] the router answers from the pools' exact ownership
// instead of the filter: agreement must be 100% and over/under-reports 0,
// which checks the harness itself.
//
// See docs/RATIONALE.md ("Why does replay use pools and a publisher instead
// of actors, and a trace clock?") for the design decisions.
package replay

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
)

// Policy decides which data center serves a request.
type Policy uint8

// Policies. Whatever the policy, the router's own answer (deepest reported
// prefix, [Deepest]) is scored for agreement; the policy only decides where
// the request is served, and so which caches fill and how long it waits.
const (
	// CacheAware is a production router's load-aware choice ([Routing]):
	// the data center, then the rank, with the lowest Dynamo cost, which
	// weighs the prefill the cached prefix saves against the candidates'
	// queued prefill and decode load (and, for a data center, the round
	// trip); SGLang's imbalance guard picks the least loaded rank first.
	// The data center's cached prefix is the router's answer (the filter,
	// or the exact index with [Config.Exact]); a rank's is exact, as a
	// data center's own router knows it.
	CacheAware Policy = iota + 1
	// Random serves at a uniformly random rank of a uniformly random data
	// center (seeded).
	Random
	// RoundRobin serves request i at data center i mod D, rank (i/D) mod R.
	RoundRobin
	// Affinity is pure prefix affinity: the data center the router reports
	// deepest, then its rank with the deepest cached prefix, ties to the one
	// that served the fewest requests ([Deepest]). A trace whose requests
	// share a first block sends them all to one rank.
	Affinity
	// LoadOnly is CacheAware's cost with every cached prefix taken as 0:
	// load balancing that sees no cache.
	LoadOnly
)

var policyNames = [...]string{CacheAware: "cache-aware", Random: "random", RoundRobin: "round-robin",
	Affinity: "affinity", LoadOnly: "load-only"}

// Policies lists every policy, in the order reports show them.
func Policies() []Policy { return []Policy{CacheAware, Affinity, LoadOnly, Random, RoundRobin} }

// String returns the policy's flag name.
func (p Policy) String() string {
	if int(p) < len(policyNames) && policyNames[p] != "" {
		return policyNames[p]
	}
	return fmt.Sprintf("Policy(%d)", p)
}

// ParsePolicy parses a policy name ("cache-aware", "affinity", "load-only",
// "random", "round-robin").
func ParsePolicy(s string) (Policy, error) {
	for p, name := range policyNames {
		if name != "" && name == strings.TrimSpace(s) {
			return Policy(p), nil
		}
	}
	return 0, &ConfigError{Field: "policy", Reason: fmt.Sprintf("unknown policy %q (want cache-aware, affinity, load-only, random or round-robin)", s)}
}

// Errors. Every configuration failure is a [*ConfigError] matching
// ErrInvalidConfig; a failed internal cross-check is an error wrapping
// ErrInvariant.
var (
	// ErrInvalidConfig: a Config field is out of range.
	ErrInvalidConfig = errors.New("replay: invalid config")
	// ErrInvariant: the pipeline disagreed with itself (a consumer refused a
	// frame the producer made, a lane's words differ from its pool's after
	// the final drain, or a pool rejected an event the fleet emitted). It
	// means a bug in ckfrelay or the harness, never bad input.
	ErrInvariant = errors.New("replay: invariant violated")
)

// ConfigError reports one invalid Config field.
type ConfigError struct {
	Field  string
	Reason string
}

func (e *ConfigError) Error() string { return "replay: " + e.Field + ": " + e.Reason }

// Unwrap lets errors.Is match ErrInvalidConfig.
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }

// Config describes one replay. Start from [DefaultConfig]; Validate runs in
// [Run].
type Config struct {
	DataCenters    int // 1..16
	WorkersPerDC   int // ≥ 1
	RanksPerWorker int // ≥ 1
	BlocksPerRank  int // LRU capacity of one rank, in blocks, ≥ 1
	// ExpectedBlocks sizes every pool's filter; 0 means the capacity of one
	// data center (WorkersPerDC × RanksPerWorker × BlocksPerRank).
	ExpectedBlocks uint64

	Policy Policy
	// Routing is the load-aware cost of CacheAware and LoadOnly.
	Routing Routing
	// Latency is the serving-time model every policy is measured under.
	Latency Latency
	// Exact answers router queries from the pools' exact ownership instead
	// of the consumer's filter. Frames still flow, so throughput and FPR are
	// still measured.
	Exact bool

	// PublishEveryNEvents is each pool's publication cadence (relay default 16).
	PublishEveryNEvents uint64
	// PublicationDelay is the publication timer: a pending tail is published
	// this long (trace time) after its first event. > 0.
	PublicationDelay time.Duration
	// Lag is how long (trace time) a published delta takes to reach the
	// router: the relay-to-router propagation delay. ≥ 0.
	Lag time.Duration
	// Speed scales the trace clock to wall time: 0 runs as fast as possible,
	// 1 at trace speed, 2 twice as fast. ≥ 0.
	Speed float64

	// Seed drives the random policy and the FPR probe keys.
	Seed uint64
	// FPRProbes is the number of never-stored keys probed against every lane
	// at the end; 0 picks enough for 16M lane probes (±5% at α = 0.5).
	FPRProbes int
	// NewConsumer builds the router's consumer; nil uses the native one
	// (client.NewNative). Pass a wasm host.Runtime's NewInstance to route
	// through the WebAssembly module.
	NewConsumer func(consumer.Manifest) (client.Lanes, error)
	// Progress, when set, is called about once per wall-clock second.
	Progress func(Progress)

	// testSkipInflight stops in-flight tracking, so tests can prove the
	// under-report check fails when an explanation is missing.
	testSkipInflight bool
}

// DefaultConfig is the 3-DC demo: 4 workers × 2 ranks × 2048 blocks per
// data center, cache-aware routing with the routers' defaults, the default
// latency model, the relay's cadence (16 events, 1 ms timer), no
// propagation lag, as fast as possible.
func DefaultConfig() Config {
	return Config{
		DataCenters: 3, WorkersPerDC: 4, RanksPerWorker: 2, BlocksPerRank: 2048,
		Policy: CacheAware, Routing: DefaultRouting(), Latency: DefaultLatency(),
		PublishEveryNEvents: 16, PublicationDelay: time.Millisecond, Seed: 1,
	}
}

// Validate checks the fields in declaration order and returns the first
// failure as a [*ConfigError].
func (c Config) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case c.DataCenters < 1 || c.DataCenters > ckf.MaxLanes:
		return bad("data centers", "%d outside 1..%d", c.DataCenters, ckf.MaxLanes)
	case c.WorkersPerDC < 1:
		return bad("workers", "%d < 1", c.WorkersPerDC)
	case c.RanksPerWorker < 1:
		return bad("ranks", "%d < 1", c.RanksPerWorker)
	case c.BlocksPerRank < 1:
		return bad("blocks per rank", "%d < 1", c.BlocksPerRank)
	}
	if _, err := ckf.BucketCount(c.expectedBlocks()); err != nil {
		return bad("expected blocks", "%v", err)
	}
	switch {
	case c.Policy < CacheAware || c.Policy > LoadOnly:
		return bad("policy", "%v is not a policy", c.Policy)
	case !(c.Routing.OverlapWeight >= 0) || !(c.Routing.Temperature >= 0) || !(c.Routing.BalanceRel >= 0):
		return bad("routing", "overlap weight, temperature and balance ratio must be ≥ 0: %+v", c.Routing)
	case c.PublishEveryNEvents == 0:
		return bad("publish every", "must be > 0")
	case c.PublicationDelay <= 0:
		return bad("publication delay", "%v must be > 0", c.PublicationDelay)
	case c.Lag < 0:
		return bad("lag", "%v must be ≥ 0", c.Lag)
	case !(c.Speed >= 0) || c.Speed > 1e9: // also rejects NaN
		return bad("speed", "%v outside 0..1e9", c.Speed)
	case c.FPRProbes < 0:
		return bad("fpr probes", "%d < 0", c.FPRProbes)
	}
	return c.Latency.validate(c.DataCenters)
}

func (c Config) expectedBlocks() uint64 {
	if c.ExpectedBlocks != 0 {
		return c.ExpectedBlocks
	}
	return uint64(c.WorkersPerDC) * uint64(c.RanksPerWorker) * uint64(c.BlocksPerRank)
}

// Progress is the running view passed to [Config.Progress].
type Progress struct {
	Elapsed        time.Duration // wall time since the replay started
	TraceTime      time.Duration // the trace clock
	Requests       uint64
	Events, Blocks uint64 // totals so far
	EventsPerSec   float64
	BlocksPerSec   float64
	AgreementPct   float64 // so far
	InFlight       int     // deltas published but not yet visible, over all data centers
	QueryP50       time.Duration
	QueryP99       time.Duration // over the last second
}

// Report is the outcome of one replay. Counts are over routed requests;
// "lane" comparisons are one per request and data center.
type Report struct {
	Policy         string  `json:"policy"`
	Exact          bool    `json:"exact"`
	DataCenters    int     `json:"data_centers"`
	RanksPerDC     int     `json:"ranks_per_dc"`
	BlocksPerRank  int     `json:"blocks_per_rank"`
	ExpectedBlocks uint64  `json:"expected_blocks"`
	BucketCount    uint64  `json:"bucket_count"`
	Requests       uint64  `json:"requests"`
	RequestBlocks  uint64  `json:"request_blocks"`
	Events         uint64  `json:"events"`
	EventBlocks    uint64  `json:"event_blocks"`
	Deltas         uint64  `json:"deltas"`
	Images         uint64  `json:"images"`
	FrameBytes     uint64  `json:"frame_bytes"`
	TraceSeconds   float64 `json:"trace_seconds"`
	WallSeconds    float64 `json:"wall_seconds"`

	// Agreement: the router's pick (deepest reported prefix) truly holds the
	// deepest prefix of any data center.
	Agree            uint64  `json:"agree"`
	AgreementPct     float64 `json:"agreement_pct"`
	WarmRequests     uint64  `json:"warm_requests"` // some data center truly held ≥ 1 block
	WarmAgree        uint64  `json:"warm_agree"`
	WarmAgreementPct float64 `json:"warm_agreement_pct"`
	Lanes            uint64  `json:"lanes_compared"`
	// LanesNotReady counts lanes that gave no answer (not ready) and so were
	// not compared. A replay's lanes are always ready.
	LanesNotReady     uint64 `json:"lanes_not_ready,omitempty"`
	OverReports       uint64 `json:"over_reports"`
	OverBlocks        uint64 `json:"over_blocks"`
	OverFalsePositive uint64 `json:"over_false_positive"` // the pool's own filter also says present
	OverStale         uint64 `json:"over_stale"`          // a removal still in flight
	UnderReports      uint64 `json:"under_reports"`
	UnderBlocks       uint64 `json:"under_blocks"`
	UnderCapacity     uint64 `json:"under_capacity"` // some hole is a capacity omission
	UnderInFlight     uint64 `json:"under_in_flight"`
	// UnexplainedUnderReports counts under-reports with a missing block that
	// is neither a counted capacity omission nor in flight, or with no
	// missing block at all. The filter has no false negatives, so this must
	// be 0.
	UnexplainedUnderReports uint64 `json:"unexplained_under_reports"`
	CapacityOmissions       uint64 `json:"capacity_omissions"` // stored blocks a pool could not make resident
	// Unclassified says over- and under-reports were counted but not
	// classified (no [Explainer]: relay demo's pools are behind HTTP), so
	// the false-positive/stale and capacity/in-flight/unexplained counts
	// are not measured.
	Unclassified bool `json:"unclassified,omitempty"`

	// Cache hit rate: blocks of each request already cached where it was served.
	HitBlocks      uint64  `json:"hit_blocks"`
	HitRatePct     float64 `json:"hit_rate_pct"`      // in the chosen data center
	RankHitRatePct float64 `json:"rank_hit_rate_pct"` // on the chosen rank

	FPRProbes    int     `json:"fpr_probes"`
	FPR          float64 `json:"fpr"`
	FPRBound     float64 `json:"fpr_bound"` // mean over lanes of 1-(1-1/65535)^(8α)
	FPRRatio     float64 `json:"fpr_ratio"`
	FilterLoad   float64 `json:"filter_load"` // mean occupied-slot fraction α
	HeldBlocks   uint64  `json:"held_blocks"` // distinct blocks held, summed over data centers
	EventsPerSec float64 `json:"events_per_sec"`
	BlocksPerSec float64 `json:"blocks_per_sec"`

	// Freshness: trace time from an event's admission to the router seeing
	// its delta (cadence, timer and lag). Delivery: wall time from a delta's
	// publication to the consumer having applied it: encode, decode and
	// apply when Lag is 0; with a lag it also includes the wall time the
	// replay spent reaching the delta's visibility time on the trace clock.
	// The demo (relay demo, behind real relays) times delivery from sending
	// a request's events (the HTTP POST, or the engine's ZMQ publish) to the
	// router's lane holding the request's last block.
	FreshnessP50Ms float64 `json:"freshness_p50_ms"`
	FreshnessP99Ms float64 `json:"freshness_p99_ms"`
	DeliveryP50Ns  int64   `json:"delivery_p50_ns"`
	DeliveryP99Ns  int64   `json:"delivery_p99_ns"`
	QueryP50Ns     int64   `json:"query_p50_ns"`
	QueryP99Ns     int64   `json:"query_p99_ns"`

	TrackedBlocks           uint64  `json:"tracked_blocks"` // unique blocks over all pools
	ProducerBytesPerBlock   float64 `json:"producer_bytes_per_block"`
	ExactStateBytesPerBlock float64 `json:"exact_state_bytes_per_block"`
	ProducerBytes           uint64  `json:"producer_bytes"`
	ConsumerBytes           uint64  `json:"consumer_bytes"`

	// The latency model ([Latency]) under the policy: time to first token
	// and queueing delay over all requests, in trace milliseconds; rank
	// imbalance is max/mean requests served per rank over the fleet; prompt
	// tokens the ranks computed and the cached ones they did not; requests
	// served outside their origin data center.
	TTFTP50Ms          float64 `json:"ttft_p50_ms"`
	TTFTP90Ms          float64 `json:"ttft_p90_ms"`
	TTFTP99Ms          float64 `json:"ttft_p99_ms"`
	TTFTMeanMs         float64 `json:"ttft_mean_ms"`
	QueueP50Ms         float64 `json:"queue_p50_ms"`
	QueueP99Ms         float64 `json:"queue_p99_ms"`
	QueueMeanMs        float64 `json:"queue_mean_ms"`
	RankImbalance      float64 `json:"rank_imbalance"`
	PrefillTokens      int64   `json:"prefill_tokens"`
	PrefillTokensSaved int64   `json:"prefill_tokens_saved"`
	PrefillSavedPct    float64 `json:"prefill_saved_pct"`
	RemotePct          float64 `json:"remote_pct"`
	// TTFTCDFMs is the TTFT at every percentile 0..100 (101 values).
	TTFTCDFMs []float64 `json:"ttft_cdf_ms,omitempty"`
	// Series is the rank hit rate and rank imbalance per window of 100
	// requests.
	Series []SeriesPoint `json:"series,omitempty"`

	// Unmeasured names, by JSON name, the figures the run could not measure
	// (their fields are zero); [WriteTable] prints them as n/a. A replay
	// measures everything.
	Unmeasured []string `json:"unmeasured,omitempty"`
}

// measured reports whether every named figure was measured.
func (r *Report) measured(names ...string) bool {
	for _, n := range names {
		if slices.Contains(r.Unmeasured, n) {
			return false
		}
	}
	return true
}

// Name names the report's run: its policy, with " (exact)" when the router
// answered from the exact index.
func (r *Report) Name() string {
	if r.Exact {
		return r.Policy + " (exact)"
	}
	return r.Policy
}
