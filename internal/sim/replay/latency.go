package replay

import (
	"fmt"
	"time"
)

// Latency is the replay's serving-time model. Each rank is a queue: a
// request's prefill waits for the rank's earlier prefills (the queueing
// delay), then takes its uncached prompt tokens over PrefillTokensPerSec;
// its first token is then back at the request's origin, so
//
//	TTFT = RTT(origin, serving DC) + queueing delay + uncached tokens / PrefillTokensPerSec
//
// (half the RTT before the rank sees the request, half for the token's way
// back). Decoding does not hold the prefill queue (continuous batching): the
// request stays active, counting towards the rank's decode load, for its
// output tokens over DecodeTokensPerSec after its prefill. A request's
// origin is data center i mod D for the i-th request: users spread evenly
// over regions.
type Latency struct {
	// BlockTokens is the tokens per trace block (Mooncake: 512).
	BlockTokens int
	// PrefillTokensPerSec is one rank's prefill throughput. > 0.
	PrefillTokensPerSec float64
	// DecodeTokensPerSec is one request's decode speed. > 0.
	DecodeTokensPerSec float64
	// RTT is the round trip between any two distinct data centers; within
	// one it is 0. ≥ 0.
	RTT time.Duration
	// RTTMatrix, when set, overrides RTT: a D×D matrix of round trips,
	// [origin][serving], non-negative.
	RTTMatrix [][]time.Duration
}

// DefaultLatency is one rank prefilling 8,192 tokens/s and decoding 50
// tokens/s per request, Mooncake's 512-token blocks, and 10 ms between data
// centers (a metro-area round trip).
func DefaultLatency() Latency {
	return Latency{BlockTokens: 512, PrefillTokensPerSec: 8192, DecodeTokensPerSec: 50, RTT: 10 * time.Millisecond}
}

// validate checks the model for dcs data centers.
func (l Latency) validate(dcs int) error {
	bad := func(format string, args ...any) error {
		return &ConfigError{Field: "latency", Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case l.BlockTokens < 1:
		return bad("block tokens %d < 1", l.BlockTokens)
	case !(l.PrefillTokensPerSec > 0) || !(l.DecodeTokensPerSec > 0):
		return bad("throughputs must be > 0 (prefill %v, decode %v tokens/s)", l.PrefillTokensPerSec, l.DecodeTokensPerSec)
	case l.RTT < 0:
		return bad("rtt %v < 0", l.RTT)
	}
	if l.RTTMatrix != nil {
		if len(l.RTTMatrix) != dcs {
			return bad("rtt matrix has %d rows for %d data centers", len(l.RTTMatrix), dcs)
		}
		for i, row := range l.RTTMatrix {
			if len(row) != dcs {
				return bad("rtt matrix row %d has %d entries for %d data centers", i, len(row), dcs)
			}
			for _, v := range row {
				if v < 0 {
					return bad("rtt matrix row %d has a negative round trip %v", i, v)
				}
			}
		}
	}
	return nil
}

// rtt returns the round trip from origin to the serving data center.
func (l Latency) rtt(origin, dc int) time.Duration {
	if l.RTTMatrix != nil {
		return l.RTTMatrix[origin][dc]
	}
	if origin == dc {
		return 0
	}
	return l.RTT
}

// prefill returns how long one rank takes to compute tokens prompt tokens.
func (l Latency) prefill(tokens int64) time.Duration {
	return time.Duration(float64(tokens) / l.PrefillTokensPerSec * float64(time.Second))
}

// decode returns how long a request takes to decode tokens output tokens.
func (l Latency) decode(tokens int64) time.Duration {
	return time.Duration(float64(tokens) / l.DecodeTokensPerSec * float64(time.Second))
}

// uncached returns the prompt tokens left to compute when depth leading
// blocks of a prompt of input tokens (over blocks blocks) are cached. A
// trace without lengths counts whole blocks.
func (l Latency) uncached(input int64, blocks, depth int) int64 {
	if input <= 0 {
		input = int64(blocks) * int64(l.BlockTokens)
	}
	return max(0, input-int64(depth)*int64(l.BlockTokens))
}

// job is one request on a rank.
type job struct {
	prefillDone time.Duration // trace time its prefill ends
	done        time.Duration // trace time its decode ends
	prefill     int64         // its uncached prompt tokens
	blocks      int64         // its prompt blocks (Dynamo's decode blocks)
}

// rankQueue is one rank's state in the latency model.
type rankQueue struct {
	free time.Duration // when the rank's prefill queue drains
	jobs []job         // active: done after the last prune
}

// load returns, at trace time t, the prefill tokens queued or running, the
// blocks of active requests and the active request count. It drops the
// requests done by t.
func (q *rankQueue) load(t time.Duration) (prefill, blocks int64, active int) {
	n := 0
	for _, j := range q.jobs {
		if j.done <= t && j.prefillDone <= t {
			continue
		}
		q.jobs[n] = j
		n++
		if j.prefillDone > t {
			prefill += j.prefill
		}
		blocks += j.blocks
	}
	q.jobs = q.jobs[:n]
	return prefill, blocks, n
}

// admit queues a request arriving at the rank at arrive and returns when
// its prefill starts and ends.
func (q *rankQueue) admit(arrive time.Duration, j job, prefill, decode time.Duration) (start, end time.Duration) {
	start = max(arrive, q.free)
	end = start + prefill
	q.free = end
	j.prefillDone, j.done = end, end+decode
	q.jobs = append(q.jobs, j)
	return start, end
}
