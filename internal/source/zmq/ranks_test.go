package zmq

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/producer"
)

// rankDriver is a source whose messages the test hands to handle directly
// (as Run's goroutine would), admitting into a real producer actor.
type rankDriver struct {
	src *Source
	h   producer.Handle
}

func newRankDriver(t testing.TB, cfg Config) *rankDriver {
	t.Helper()
	pcfg := ckf.DefaultConfig()
	pcfg.ExpectedBlocks = 1 << 12
	pool, err := ckf.NewPool(pcfg)
	require.NoError(t, err)
	prod := producer.DefaultConfig()
	prod.Logger = quietLogger()
	h, _, err := producer.Start(pool, producer.Scope{ProducerIncarnation: 1}, prod)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = h.Shutdown(ctx)
	})
	cfg.Bind, cfg.BlockSize, cfg.Logger = "tcp://127.0.0.1:1", 16, quietLogger()
	src, err := New(cfg)
	require.NoError(t, err)
	return &rankDriver{src: src, h: h}
}

// heartbeat is an empty batch of rank dp at seq.
func heartbeat(t testing.TB, dp uint32, seq int64) inbound {
	payload, err := msgpack.Marshal([]any{1.0, []any{}, dp})
	require.NoError(t, err)
	return inbound{socket: -1, frames: [][]byte{nil, binary.BigEndian.AppendUint64(nil, uint64(seq)), payload}}
}

// 5,000 distinct data_parallel_rank values on a bound source: the first
// DefaultMaxRanks are tracked, the rest rejected and counted.
func TestSource_RanksAreBounded(t *testing.T) {
	d := newRankDriver(t, Config{})
	const ranks = 5000
	for dp := range uint32(ranks) {
		require.NoError(t, d.src.handle(t.Context(), d.h, heartbeat(t, dp, 0)))
	}
	st := d.src.Status()
	assert.Len(t, st.Ranks, DefaultMaxRanks)
	assert.EqualValues(t, ranks-DefaultMaxRanks, st.Rejected)
	assert.Contains(t, st.LastError, "beyond the source's 64 ranks")
	for i, r := range st.Ranks {
		require.EqualValues(t, i, r.DPRank, "sorted by rank")
	}
	// A configured dp_ranks is the bound.
	d = newRankDriver(t, Config{DPRanks: 4})
	for dp := range uint32(10) {
		require.NoError(t, d.src.handle(t.Context(), d.h, heartbeat(t, dp, 0)))
	}
	assert.Len(t, d.src.Status().Ranks, 4)
	assert.EqualValues(t, 6, d.src.Status().Rejected)
}

// BenchmarkSource_ManyRanks handles heartbeats spread over R ranks; the
// per-message cost must not grow with R (each message once re-published
// and insertion-sorted every rank).
func BenchmarkSource_ManyRanks(b *testing.B) {
	for _, r := range []int{1, 64, 5000} {
		b.Run(fmt.Sprintf("ranks=%d", r), func(b *testing.B) {
			d := newRankDriver(b, Config{})
			msgs := make([]inbound, 0, 8*r)
			for round := range int64(8) {
				for dp := range uint32(r) {
					msgs = append(msgs, heartbeat(b, dp, round))
				}
			}
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				_ = d.src.handle(context.Background(), d.h, msgs[i%len(msgs)])
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msg/s")
		})
	}
}
