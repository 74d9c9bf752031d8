package zmq

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/sim/engine"
)

// TestSource_RandomHistories drives an emulated engine through random
// histories of stores, evictions, clears, lost and duplicated batches,
// restarts and silences, and checks the pool against the engine's ground
// truth: exact when the rank is live; when it is degraded, the reason is
// counted and nothing the engine no longer holds is advertised.
func TestSource_RandomHistories(t *testing.T) {
	histories := 12
	if testing.Short() {
		histories = 4
	}
	for seed := range uint64(histories) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { randomHistory(t, seed) })
	}
}

func randomHistory(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 42))
	pub, rep := endpoint(t, 1)
	ecfg := engine.Config{Endpoint: pub, Replay: rep, Seed: seed,
		Form: engine.Form(rng.IntN(2)), Layout: engine.Layout(rng.IntN(2)),
		PublisherID: rng.IntN(2) == 0, BufferSteps: 4 + rng.IntN(12)}
	e := startEngine(t, ecfg)
	const timeout = 150 * time.Millisecond
	hs := newHarness(t, Config{Endpoint: pub, Replay: rep, Worker: 5, SourceTimeout: timeout})
	hs.publishUntilSeen(e, 0)
	ever := map[uint64]uint64{}
	var steps []string
	for range 30 {
		held := e.Held()
		switch k := rng.IntN(20); {
		case k < 7: // store: a new root or under a held block
			parent := uint64(0)
			if len(held) > 0 && rng.IntN(3) > 0 {
				parent = held[rng.IntN(len(held))]
			}
			bs, err := e.Store(parent, 1+rng.IntN(4))
			require.NoError(t, err)
			for _, b := range bs {
				ever[b.Hash] = b.Canonical
			}
			steps = append(steps, "store")
		case k < 10 && len(held) > 0:
			require.NoError(t, e.Remove(held[rng.IntN(len(held))]))
			steps = append(steps, "remove")
		case k < 11:
			require.NoError(t, e.Clear())
			steps = append(steps, "clear")
		case k < 14:
			n := 1 + rng.IntN(6)
			e.DropNext(n)
			steps = append(steps, fmt.Sprint("drop", n))
		case k < 16:
			require.NoError(t, e.Duplicate())
			steps = append(steps, "duplicate")
		case k < 17:
			require.NoError(t, e.Restart())
			steps = append(steps, "restart")
		case k < 18:
			time.Sleep(timeout + timeout/2)
			steps = append(steps, "silence")
		default:
			require.NoError(t, e.Heartbeat())
			steps = append(steps, "heartbeat")
		}
	}
	r := hs.publishUntilSeen(e, 0)
	st := hs.src.Status()
	hs.stop()
	t.Logf("engine %+v, steps %v, final rank %+v, status %+v", ecfg, steps, r, st)
	truth := e.Truth()
	requireNoStale(t, hs.pool, ever, truth)
	m := ckf.Member{WorkerID: 5}
	switch r.State {
	case RankLive:
		requireExact(t, hs.pool, m, truth)
	case RankDegraded:
		assert.NotEmpty(t, r.Reason)
		assert.Positive(t, st.Degraded, "a degraded rank is counted")
		assert.LessOrEqual(t, memberBlocks(hs.pool, m), len(truth))
	default:
		require.Fail(t, fmt.Sprintf("rank left in state %q", r.State))
	}
	assert.Zero(t, hs.faults.Load(), "no history may fault the pool")
}
