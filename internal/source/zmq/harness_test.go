package zmq

import (
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/sim/engine"
	"github.com/ckfrelay/ckfrelay/internal/source"
	"github.com/ckfrelay/ckfrelay/producer"
)

// harness runs a real source against a real producer actor and pool.
type harness struct {
	t      testing.TB
	src    *Source
	h      producer.Handle
	pool   *ckf.Pool
	cancel context.CancelFunc
	runErr chan error
	faults atomic.Int64
}

// quietLogger discards the source's log; ZMQ_TEST_LOG=1 shows it on stderr
// at debug level.
func quietLogger() *slog.Logger {
	if os.Getenv("ZMQ_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func newHarness(t testing.TB, cfg Config) *harness {
	t.Helper()
	return newHarnessWith(t, cfg, nil, nil)
}

// newHarnessWith is newHarness with the actor journalling into j (nil:
// none), and before, if set, called with the harness before the source
// runs.
func newHarnessWith(t testing.TB, cfg Config, j producer.Journal, before func(*harness)) *harness {
	t.Helper()
	pcfg := ckf.DefaultConfig()
	pcfg.ExpectedBlocks = 1 << 14
	pool, err := ckf.NewPool(pcfg)
	require.NoError(t, err)
	prod := producer.DefaultConfig()
	prod.Logger = quietLogger()
	prod.Journal = j
	h, faults, err := producer.Start(pool, producer.Scope{ProducerIncarnation: 1}, prod)
	require.NoError(t, err)
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff, cfg.MaxBackoff = 5*time.Millisecond, 50*time.Millisecond
	}
	if cfg.BlockSize == 0 {
		cfg.BlockSize = 16
	}
	if cfg.Engine == "" {
		cfg.Engine = "vllm"
	}
	src, err := New(cfg)
	require.NoError(t, err)
	hs := &harness{t: t, src: src, h: h, pool: pool, runErr: make(chan error, 1)}
	go func() {
		for f := range faults {
			hs.faults.Add(1)
			t.Logf("fault: %v", f)
		}
	}()
	if before != nil {
		before(hs)
	}
	ctx, cancel := context.WithCancel(context.Background())
	hs.cancel = cancel
	go func() { hs.runErr <- src.Run(ctx, h) }()
	t.Cleanup(func() { hs.stop() })
	return hs
}

// stop ends the source and the actor; the pool is safe to read afterwards.
func (hs *harness) stop() {
	if hs.cancel == nil {
		return
	}
	hs.cancel()
	hs.cancel = nil
	require.NoError(hs.t, <-hs.runErr)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = hs.h.Shutdown(ctx)
	<-hs.h.Done()
}

// rank returns rank dp's status, if the source has heard it.
func rankOf(st source.Status, dp uint32) (source.RankStatus, bool) {
	for _, r := range st.Ranks {
		if r.DPRank == dp {
			return r, true
		}
	}
	return source.RankStatus{}, false
}

// publishUntilSeen heartbeats until the source has applied the engine's
// latest batch (a SUB's subscription reaches a PUB a moment after connecting,
// and a gap is only noticed when a later batch arrives). The batch must be
// the current lifetime's: the source heard a message after the heartbeat was
// sent and, when the engine sends a publisher_id, the rank's publisher is the
// engine's. A sequence alone is not enough: after a restart the new lifetime
// reaches the sequence the source last applied from the old one.
func (hs *harness) publishUntilSeen(e *engine.Engine, dp uint32) source.RankStatus {
	hs.t.Helper()
	var last source.RankStatus
	require.Eventually(hs.t, func() bool {
		sent := time.Now()
		require.NoError(hs.t, e.Heartbeat())
		pubID := hex.EncodeToString(e.PublisherID())
		deadline := time.Now().Add(200 * time.Millisecond)
		for time.Now().Before(deadline) {
			st := hs.src.Status()
			r, ok := rankOf(st, dp)
			last = r
			if ok && int64(r.Seq) == e.Seq() && r.State != RankReset && st.LastEvent.After(sent) &&
				(pubID == "" || r.Publisher == pubID) {
				return true
			}
			time.Sleep(2 * time.Millisecond)
		}
		return false
	}, 15*time.Second, time.Millisecond, "rank %d never caught up with seq %d: %+v", dp, e.Seq(), last)
	return last
}

// memberBlocks is the number of blocks the pool holds for m.
func memberBlocks(pool *ckf.Pool, m ckf.Member) int {
	for _, mc := range pool.MemberCounts() {
		if mc.Member == m {
			return mc.Blocks
		}
	}
	return 0
}

// requireExact checks the pool holds exactly the engine's blocks for m.
func requireExact(t testing.TB, pool *ckf.Pool, m ckf.Member, truth map[uint64]engine.Block) {
	t.Helper()
	require.Equal(t, len(truth), memberBlocks(pool, m), "member %v block count", m)
	for _, b := range truth {
		owners, _ := pool.Owners(b.Canonical)
		require.Equal(t, uint32(1), owners, "block %#x (canonical %#x) not held", b.Hash, b.Canonical)
	}
}

// requireNoStale checks no block the engine no longer holds is advertised.
func requireNoStale(t testing.TB, pool *ckf.Pool, ever map[uint64]uint64, truth map[uint64]engine.Block) {
	t.Helper()
	for h, c := range ever {
		if _, held := truth[h]; held {
			continue
		}
		owners, _ := pool.Owners(c)
		require.Zero(t, owners, "stale block %#x (canonical %#x) still owned", h, c)
	}
}

func endpoint(t testing.TB, n int) (pub, replay string) {
	t.Helper()
	base, err := engine.FreePorts(2 * n)
	require.NoError(t, err)
	return fmt.Sprintf("tcp://127.0.0.1:%d", base), fmt.Sprintf("tcp://127.0.0.1:%d", base+n)
}
