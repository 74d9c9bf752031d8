package replay

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// Cause is a set of reasons a lane's reported depth differs from the truth,
// as an [Explainer] finds them.
type Cause uint8

// Causes. An over-report is a false positive or stale; an under-report may
// have several holes with different causes, so it can carry both
// CauseCapacity and CauseInFlight, and CauseUnexplained as well when one
// hole has neither excuse (or there is no hole at all).
const (
	// CauseFalsePositive: the pool's own filter holds the first block the
	// data center does not, so the router answered what the producer
	// published.
	CauseFalsePositive Cause = 1 << iota
	// CauseStale: the pool's filter no longer holds that block; the removal
	// is in flight to the router.
	CauseStale
	// CauseCapacity: a missing block was stored but left non-resident for
	// capacity.
	CauseCapacity
	// CauseInFlight: a missing block's delta had not reached the router.
	CauseInFlight
	// CauseUnexplained: a missing block has no excuse, or no block is
	// missing. The filter has no false negatives, so this is a bug.
	CauseUnexplained
)

// Explainer classifies the lanes a [Scorer] finds wrong. The replay harness
// implements it from its pools and its record of deltas in flight; a caller
// that cannot see the pools (relay demo, whose pools live behind HTTP)
// passes none, and the report says the reports are unclassified.
type Explainer interface {
	// ExplainOver classifies lane d reporting more than its true depth.
	ExplainOver(d, truth int) (Cause, error)
	// ExplainUnder classifies lane d reporting fewer than its true depth.
	ExplainUnder(d, reported, truth int) (Cause, error)
}

// ErrObservation: an observation's slices do not match the scorer's data
// centers, or a data center index is out of range.
var ErrObservation = errors.New("replay: malformed observation")

// Scorer is the per-request accounting shared by [Run] and `relay demo`:
// for every routed request it compares the router's answer per data center
// with the exact truth and counts best-DC agreement, depth over- and
// under-reports (with blocks, classified by an optional [Explainer]), the
// cache hit rate where requests were served, and the router's query latency;
// it also measures the false-positive rate against the theoretical bound at
// the measured load ([Scorer.ProbeFPR]) and records freshness samples.
// [Scorer.Fill] writes its figures into a [Report].
//
// A Scorer is not safe for concurrent use.
type Scorer struct {
	dcs int
	ex  Explainer
	r   Report // only the fields the scorer owns

	queryNs   []int64
	freshness []int64
}

// NewScorer returns a scorer for dataCenters data centers (1..16). ex may be
// nil: over- and under-reports are then counted but not classified.
func NewScorer(dataCenters int, ex Explainer) (*Scorer, error) {
	if dataCenters < 1 || dataCenters > ckf.MaxLanes {
		return nil, &ConfigError{Field: "data centers", Reason: fmt.Sprintf("%d outside 1..%d", dataCenters, ckf.MaxLanes)}
	}
	return &Scorer{dcs: dataCenters, ex: ex}, nil
}

// Observe scores one routed request of blocks blocks. truth[d] is data
// center d's exact cached prefix depth at query time; reported[d] the
// router's answer for lane d, or a negative value when the lane gave none
// (not ready: the lane is counted in LanesNotReady and not compared).
// chosen is the data center the router's answer picks, served the one that
// served the request (they differ under the random and round-robin
// policies); query is how long the router's query took.
//
// A malformed observation (slice lengths other than the data-center count,
// an index out of range, a negative depth or blocks) fails with
// [ErrObservation] and counts nothing. An Explainer's error is returned as
// is, after the request was counted.
func (s *Scorer) Observe(truth, reported []int, chosen, served, blocks int, query time.Duration) error {
	if len(truth) != s.dcs || len(reported) != s.dcs || chosen < 0 || chosen >= s.dcs ||
		served < 0 || served >= s.dcs || blocks < 0 {
		return fmt.Errorf("%w: %d truths, %d answers, chosen %d, served %d, %d blocks for %d data centers",
			ErrObservation, len(truth), len(reported), chosen, served, blocks, s.dcs)
	}
	maxTruth := 0
	for _, t := range truth {
		if t < 0 {
			return fmt.Errorf("%w: negative true depth %d", ErrObservation, t)
		}
		maxTruth = max(maxTruth, t)
	}
	r := &s.r
	s.queryNs = append(s.queryNs, query.Nanoseconds())
	r.Requests++
	r.RequestBlocks += uint64(blocks)
	r.HitBlocks += uint64(truth[served])
	if truth[chosen] == maxTruth {
		r.Agree++
	}
	if maxTruth > 0 {
		r.WarmRequests++
		if truth[chosen] == maxTruth {
			r.WarmAgree++
		}
	}
	for d := range s.dcs {
		got, want := reported[d], truth[d]
		if got < 0 {
			r.LanesNotReady++
			continue
		}
		r.Lanes++
		switch {
		case got > want:
			r.OverReports++
			r.OverBlocks += uint64(got - want)
			if s.ex == nil {
				continue
			}
			c, err := s.ex.ExplainOver(d, want)
			if err != nil {
				return err
			}
			if c&CauseFalsePositive != 0 {
				r.OverFalsePositive++
			}
			if c&CauseStale != 0 {
				r.OverStale++
			}
		case got < want:
			r.UnderReports++
			r.UnderBlocks += uint64(want - got)
			if s.ex == nil {
				continue
			}
			c, err := s.ex.ExplainUnder(d, got, want)
			if err != nil {
				return err
			}
			if c&CauseCapacity != 0 {
				r.UnderCapacity++
			}
			if c&CauseInFlight != 0 {
				r.UnderInFlight++
			}
			if c&CauseUnexplained != 0 {
				r.UnexplainedUnderReports++
			}
		}
	}
	return nil
}

// ObserveFreshness records one freshness sample: how long an admitted event
// took to become visible to the router.
func (s *Scorer) ObserveFreshness(d time.Duration) {
	s.freshness = append(s.freshness, int64(d))
}

// Requests returns the number of requests observed.
func (s *Scorer) Requests() uint64 { return s.r.Requests }

// AgreementPct returns the best-DC agreement so far, in percent (0 before
// any request).
func (s *Scorer) AgreementPct() float64 {
	return 100 * float64(s.r.Agree) / float64(max(s.r.Requests, 1))
}

// QueryWindow returns the query latency p50 and p99 over the requests
// observed since mark (a value QueryWindow returned before, or 0), and the
// mark to pass next time. Per-second progress lines use it.
func (s *Scorer) QueryWindow(mark int) (p50, p99 time.Duration, next int) {
	mark = min(max(mark, 0), len(s.queryNs))
	recent := s.queryNs[mark:]
	return time.Duration(Percentile(recent, 0.50)), time.Duration(Percentile(recent, 0.99)), len(s.queryNs)
}

// ProbeFPR measures the false-positive rate: probes random 64-bit keys no
// one stored (a collision with a stored canonical hash has probability
// ~2^-48), seeded by seed, are probed against every lane at once through
// contains, which returns the mask of lanes holding a key. loads[d] is lane
// d's filter load α (occupied slots over slots); the bound is the mean over
// lanes of 1-(1-1/65535)^(8α): two candidate buckets of four 16-bit
// fingerprints. probes ≤ 0 picks enough for 16M lane probes. A contains
// error stops the probing; the rate is over the planned probes, as if the
// rest had missed, and the error is returned.
func (s *Scorer) ProbeFPR(contains func(uint64) (uint16, error), loads []float64, probes int, seed uint64) error {
	if len(loads) != s.dcs {
		return fmt.Errorf("%w: %d loads for %d data centers", ErrObservation, len(loads), s.dcs)
	}
	r := &s.r
	r.FilterLoad, r.FPRBound = 0, 0
	for _, alpha := range loads {
		r.FilterLoad += alpha / float64(s.dcs)
		r.FPRBound += (1 - math.Pow(1-1.0/65535, 8*alpha)) / float64(s.dcs)
	}
	if probes <= 0 {
		probes = (16_000_000 + s.dcs - 1) / s.dcs
	}
	rng := rand.New(rand.NewPCG(seed, 0xF0F0F0F0))
	all := uint16(1<<s.dcs - 1)
	hits := 0
	var err error
	for range probes {
		var m uint16
		if m, err = contains(rng.Uint64()); err != nil {
			break
		}
		hits += bits.OnesCount16(m & all)
	}
	r.FPRProbes = probes
	r.FPR = float64(hits) / float64(probes*s.dcs)
	r.FPRRatio = 0
	if r.FPRBound > 0 {
		r.FPRRatio = r.FPR / r.FPRBound
	}
	return err
}

// Fill writes the scorer's figures into r, leaving every other field as it
// is: request and lane counts, agreement, over- and under-reports and their
// classification (or Unclassified), cache hit rate, query and freshness
// percentiles, and the FPR figures once [Scorer.ProbeFPR] ran.
func (s *Scorer) Fill(r *Report) {
	src := &s.r
	pct := func(a, b uint64) float64 {
		if b == 0 {
			return 0
		}
		return 100 * float64(a) / float64(b)
	}
	r.Requests, r.RequestBlocks = src.Requests, src.RequestBlocks
	r.Agree, r.AgreementPct = src.Agree, pct(src.Agree, src.Requests)
	r.WarmRequests, r.WarmAgree = src.WarmRequests, src.WarmAgree
	r.WarmAgreementPct = pct(src.WarmAgree, src.WarmRequests)
	r.Lanes, r.LanesNotReady = src.Lanes, src.LanesNotReady
	r.OverReports, r.OverBlocks = src.OverReports, src.OverBlocks
	r.OverFalsePositive, r.OverStale = src.OverFalsePositive, src.OverStale
	r.UnderReports, r.UnderBlocks = src.UnderReports, src.UnderBlocks
	r.UnderCapacity, r.UnderInFlight = src.UnderCapacity, src.UnderInFlight
	r.UnexplainedUnderReports = src.UnexplainedUnderReports
	r.Unclassified = s.ex == nil
	r.HitBlocks, r.HitRatePct = src.HitBlocks, pct(src.HitBlocks, src.RequestBlocks)
	r.QueryP50Ns, r.QueryP99Ns = Percentile(s.queryNs, 0.50), Percentile(s.queryNs, 0.99)
	r.FreshnessP50Ms = float64(Percentile(s.freshness, 0.50)) / 1e6
	r.FreshnessP99Ms = float64(Percentile(s.freshness, 0.99)) / 1e6
	r.FPRProbes, r.FPR, r.FPRBound, r.FPRRatio = src.FPRProbes, src.FPR, src.FPRBound, src.FPRRatio
	r.FilterLoad = src.FilterLoad
}
