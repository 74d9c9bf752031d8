package replay

import "time"

// Sweep is the multi-DC trade-off under a [Latency] model: for a request
// whose prompt a remote data center holds cached (all but its last block)
// and its origin data center does not, is sending it there (paying the round
// trip, computing one block) faster than recomputing the whole prompt at
// home? SavingMs[i][j] is home TTFT minus remote TTFT, in milliseconds, at
// round trip RTTMs[i] and prompt length PromptTokens[j], with both data
// centers' ranks idle: > 0 means the remote data center wins.
// RouterRemote[i][j] says whether the [CacheAware] cost picks the remote
// data center there; on idle ranks it agrees with the model exactly when
// OverlapWeight is 1.
type Sweep struct {
	RTTMs        []float64   `json:"rtt_ms"`
	PromptTokens []int64     `json:"prompt_tokens"`
	SavingMs     [][]float64 `json:"saving_ms"`
	// Speedup[i][j] is home TTFT over remote TTFT: > 1 means remote wins.
	Speedup      [][]float64 `json:"speedup"`
	RouterRemote [][]bool    `json:"router_remote"`
	// BreakEvenRTTMs[j] is the round trip below which the remote data
	// center wins for PromptTokens[j].
	BreakEvenRTTMs []float64 `json:"break_even_rtt_ms"`
}

// DefaultSweepRTTs are round trips from a metro area to another continent.
var DefaultSweepRTTs = []time.Duration{time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond,
	25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond}

// DefaultSweepPrompts are prompt lengths from one block to 128k tokens.
var DefaultSweepPrompts = []int64{512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072}

// TradeOff computes the sweep over rtts × prompts (tokens) under l and r.
func TradeOff(l Latency, r Routing, rtts []time.Duration, prompts []int64) Sweep {
	var s Sweep
	bt := int64(l.BlockTokens)
	for _, p := range prompts {
		s.PromptTokens = append(s.PromptTokens, p)
		cached := max(0, (p+bt-1)/bt-1) * bt
		s.BreakEvenRTTMs = append(s.BreakEvenRTTMs, float64(l.prefill(cached))/1e6)
	}
	for _, rtt := range rtts {
		s.RTTMs = append(s.RTTMs, float64(rtt)/1e6)
		var saving, speedup []float64
		var remote []bool
		for _, p := range prompts {
			cached := max(0, (p+bt-1)/bt-1) * bt
			home := l.prefill(p)
			away := rtt + l.prefill(p-cached)
			saving = append(saving, float64(home-away)/1e6)
			speedup = append(speedup, float64(home)/float64(max(away, 1)))
			// The cost's terms on idle ranks; decode blocks are equal.
			homeCost := r.OverlapWeight * float64(p) / float64(bt)
			awayCost := r.OverlapWeight * (float64(p-cached)/float64(bt) + rtt.Seconds()*l.PrefillTokensPerSec/float64(bt))
			remote = append(remote, awayCost < homeCost)
		}
		s.SavingMs = append(s.SavingMs, saving)
		s.Speedup = append(s.Speedup, speedup)
		s.RouterRemote = append(s.RouterRemote, remote)
	}
	return s
}
