package consumer

import (
	"testing"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/stretchr/testify/require"
)

// BenchmarkSearch isolates the prefix search (no hashing): a 1024-block
// query by sequence hashes over the 16-lane fixture, whose lanes answer 16
// different depths (≈ 120 probes), and the same number of bare probes
// (rowHits), so the difference is the search's own bookkeeping.
func BenchmarkSearch(b *testing.B) {
	f := getBenchFixture(b)
	f.setReady(b, lanes)
	tokens := f.requests[1024]
	seq := ckf.AppendSequenceHashes(nil, ckf.AppendLocalBlockHashes(nil, tokens, benchBlockSize, ckf.BaseSalt))
	var res QueryResult
	require.NoError(b, f.c.QuerySequenceHashes(seq, &res))
	probes := res.Probes
	b.Run("kind=search", func(b *testing.B) {
		d := make([]time.Duration, 0, b.N)
		for b.Loop() {
			t0 := time.Now()
			_ = f.c.QuerySequenceHashes(seq, &res)
			d = append(d, time.Since(t0))
		}
		reportLatency(b, d)
		b.ReportMetric(float64(res.Probes), "probes/op")
	})
	b.Run("kind=probes", func(b *testing.B) {
		var m uint16
		d := make([]time.Duration, 0, b.N)
		for b.Loop() {
			t0 := time.Now()
			for p := range probes {
				m ^= f.c.rowHits(seq[p*len(seq)/probes], 0xFFFF)
			}
			d = append(d, time.Since(t0))
		}
		benchSink += uint32(m)
		reportLatency(b, d)
		b.ReportMetric(float64(probes), "probes/op")
	})
}
