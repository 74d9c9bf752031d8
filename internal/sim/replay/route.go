package replay

import (
	"math"
	"math/rand/v2"
)

// Deepest is the pure-affinity choice: the index with the deepest reported
// prefix, ties to the one with the least load, then the lowest index. A
// negative depth (a lane that gave no answer) never beats an answer. It is
// the router's pick the [Scorer] checks for agreement in replay and in
// `relay demo`, and the [Affinity] placement policy.
func Deepest(depths []int, load []uint64) int {
	best := 0
	for d := range depths {
		if depths[d] > depths[best] || (depths[d] == depths[best] && load[d] < load[best]) {
			best = d
		}
	}
	return best
}

// Routing configures the load-aware choice of the [CacheAware] and
// [LoadOnly] policies: NVIDIA Dynamo's KV router cost, with SGLang's router
// imbalance guard in front of it. See docs/RATIONALE.md ("Why does replay
// route with Dynamo's cost and SGLang's guard?") for the sources.
//
// A candidate's cost (lower is better) is
//
//	OverlapWeight × prefill blocks + decode blocks
//
// where prefill blocks are the prompt tokens the candidate would have to
// compute (its queued prefill plus the request's uncached tokens) over the
// block size, and decode blocks are the blocks of the requests it is
// decoding plus the request's own. Costs are divided by the largest, and
// with Temperature 0 the lowest wins (ties at random); with Temperature > 0
// a candidate is drawn with probability softmax(-cost/(max-min)/T).
//
// Before the cost, SGLang's guard: when the candidates' active request
// counts are imbalanced (max-min > BalanceAbs and max > BalanceRel × min)
// the least loaded wins outright. BalanceAbs < 0 disables the guard.
type Routing struct {
	OverlapWeight float64 // Dynamo's kv_overlap_score_weight; default 1
	Temperature   float64 // Dynamo's router_temperature; default 0 (argmin)
	BalanceAbs    int     // SGLang's balance_abs_threshold; default 64
	BalanceRel    float64 // SGLang's balance_rel_threshold; default 1.5
}

// DefaultRouting returns the routers' published defaults.
func DefaultRouting() Routing {
	return Routing{OverlapWeight: 1, Temperature: 0, BalanceAbs: 64, BalanceRel: 1.5}
}

// imbalanced reports SGLang's condition on active request counts.
func (r Routing) imbalanced(active []int) bool {
	if r.BalanceAbs < 0 || len(active) == 0 {
		return false
	}
	lo, hi := active[0], active[0]
	for _, a := range active {
		lo, hi = min(lo, a), max(hi, a)
	}
	return hi-lo > r.BalanceAbs && float64(hi) > r.BalanceRel*float64(lo)
}

// pick returns the index Dynamo's selector draws from costs (lower is
// better), using rng for ties and sampling.
func (r Routing) pick(costs []float64, rng *rand.Rand) int {
	hi := math.Inf(-1)
	for _, c := range costs {
		hi = max(hi, c)
	}
	norm := make([]float64, len(costs))
	for i, c := range costs {
		norm[i] = c
		if hi > 0 {
			norm[i] = c / hi
		}
	}
	lo := math.Inf(1)
	for _, c := range norm {
		lo = min(lo, c)
	}
	hiN := math.Inf(-1)
	for _, c := range norm {
		hiN = max(hiN, c)
	}
	if r.Temperature <= 0 || hiN == lo {
		// argmin, ties at random (with T > 0 and equal costs: uniform)
		n, pick := 0, 0
		for i, c := range norm {
			if c == lo || (r.Temperature > 0) {
				n++
				if rng.IntN(n) == 0 {
					pick = i
				}
			}
		}
		return pick
	}
	w := make([]float64, len(norm))
	top, sum := math.Inf(-1), 0.0
	for i, c := range norm {
		w[i] = -c / (hiN - lo) / r.Temperature
		top = max(top, w[i])
	}
	for i := range w {
		w[i] = math.Exp(w[i] - top)
		sum += w[i]
	}
	u := rng.Float64() * sum
	for i, x := range w {
		if u < x {
			return i
		}
		u -= x
	}
	return len(w) - 1
}
