package zmq

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/sim/engine"
)

func startEngine(t testing.TB, cfg engine.Config) *engine.Engine {
	t.Helper()
	e, err := engine.Start(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// storeSome publishes a few chains and an eviction; it returns the engine's
// held blocks.
func storeSome(t testing.TB, e *engine.Engine) {
	t.Helper()
	a, err := e.Store(0, 3)
	require.NoError(t, err)
	_, err = e.Store(a[2].Hash, 2)
	require.NoError(t, err)
	_, err = e.Store(0, 1)
	require.NoError(t, err)
	require.NoError(t, e.Remove(a[2].Hash))
}

func TestSource_LiveInEveryForm(t *testing.T) {
	for _, form := range []engine.Form{engine.Positional, engine.Named} {
		for _, layout := range []engine.Layout{engine.SeqPayload, engine.TopicSeqPayload} {
			t.Run(fmt.Sprintf("form%d_layout%d", form, layout), func(t *testing.T) {
				pub, rep := endpoint(t, 1)
				e := startEngine(t, engine.Config{Endpoint: pub, Replay: rep, Form: form, Layout: layout,
					Topic: "kv@w7", DPRank: 2, PublisherID: layout == engine.TopicSeqPayload, Seed: uint64(form*2) + uint64(layout)})
				hs := newHarness(t, Config{Endpoint: pub, Replay: rep, Topic: "kv@", Worker: 7})
				storeSome(t, e)
				r := hs.publishUntilSeen(e, 2)
				assert.Equal(t, RankLive, r.State)
				hs.stop()
				requireExact(t, hs.pool, ckf.Member{WorkerID: 7, DPRank: 2}, e.Truth())
				assert.Zero(t, hs.faults.Load())
			})
		}
	}
}

func TestSource_TopicFilter(t *testing.T) {
	pub, rep := endpoint(t, 1)
	e := startEngine(t, engine.Config{Endpoint: pub, Replay: rep, Topic: "other"})
	hs := newHarness(t, Config{Endpoint: pub, Replay: rep, Topic: "kv", Worker: 1})
	storeSome(t, e)
	time.Sleep(100 * time.Millisecond) // nothing can arrive; give it the chance
	require.NoError(t, e.Heartbeat())
	time.Sleep(100 * time.Millisecond)
	assert.Zero(t, hs.src.Status().Batches)
}

func TestSource_EngineStartedAfterRelay(t *testing.T) {
	pub, rep := endpoint(t, 1)
	hs := newHarness(t, Config{Endpoint: pub, Replay: rep, Worker: 3})
	time.Sleep(50 * time.Millisecond) // several dials fail meanwhile
	assert.Equal(t, "connecting", hs.src.Status().State)
	e := startEngine(t, engine.Config{Endpoint: pub, Replay: rep})
	storeSome(t, e)
	hs.publishUntilSeen(e, 0)
	hs.stop()
	requireExact(t, hs.pool, ckf.Member{WorkerID: 3}, e.Truth())
}

func TestSource_EngineKilledAndRestarted(t *testing.T) {
	for _, pubID := range []bool{false, true} {
		t.Run(fmt.Sprintf("publisher_id=%v", pubID), func(t *testing.T) {
			pub, rep := endpoint(t, 1)
			e := startEngine(t, engine.Config{Endpoint: pub, Replay: rep, PublisherID: pubID})
			hs := newHarness(t, Config{Endpoint: pub, Replay: rep, Worker: 3})
			storeSome(t, e)
			hs.publishUntilSeen(e, 0)
			old := e.Truth()
			require.NoError(t, e.Restart())
			_, err := e.Store(0, 2)
			require.NoError(t, err)
			r := hs.publishUntilSeen(e, 0)
			st := hs.src.Status()
			assert.GreaterOrEqual(t, st.Restarts, uint64(1))
			assert.Equal(t, RankLive, r.State)
			assert.GreaterOrEqual(t, r.Epoch, uint64(2))
			hs.stop()
			requireExact(t, hs.pool, ckf.Member{WorkerID: 3}, e.Truth())
			for _, b := range old {
				owners, _ := hs.pool.Owners(b.Canonical)
				assert.Zero(t, owners, "block of the dead engine still advertised")
			}
		})
	}
}

func TestSource_GapFilledFromReplay(t *testing.T) {
	for _, layout := range []engine.Layout{engine.SeqPayload, engine.TopicSeqPayload} {
		t.Run(fmt.Sprint(layout), func(t *testing.T) {
			pub, rep := endpoint(t, 1)
			e := startEngine(t, engine.Config{Endpoint: pub, Replay: rep, Layout: layout, Topic: "t"})
			hs := newHarness(t, Config{Endpoint: pub, Replay: rep, Worker: 1})
			hs.publishUntilSeen(e, 0)
			e.DropNext(3)
			storeSome(t, e) // 4 batches, the first 3 lost
			r := hs.publishUntilSeen(e, 0)
			st := hs.src.Status()
			assert.EqualValues(t, uint64(1), st.Gaps)
			assert.GreaterOrEqual(t, st.Replays, uint64(1))
			assert.Zero(t, st.Degraded)
			assert.Equal(t, RankLive, r.State)
			hs.stop()
			requireExact(t, hs.pool, ckf.Member{WorkerID: 1}, e.Truth())
		})
	}
}

func TestSource_UncoverableGapDegradesThenClearHeals(t *testing.T) {
	for _, replay := range []bool{false, true} {
		t.Run(fmt.Sprintf("replay=%v", replay), func(t *testing.T) {
			pub, rep := endpoint(t, 1)
			if !replay {
				rep = ""
			}
			e := startEngine(t, engine.Config{Endpoint: pub, Replay: rep, BufferSteps: 2})
			hs := newHarness(t, Config{Endpoint: pub, Replay: rep, Worker: 1})
			// Joining mid-stream without a usable replay is itself degraded;
			// a Clear makes the rank exact, the baseline for what follows.
			hs.publishUntilSeen(e, 0)
			require.NoError(t, e.Clear())
			require.Equal(t, RankLive, hs.publishUntilSeen(e, 0).State)
			base := hs.src.Status().Degraded
			baseStats, err := hs.h.Stats(t.Context())
			require.NoError(t, err)
			a, err := e.Store(0, 2)
			require.NoError(t, err)
			hs.publishUntilSeen(e, 0)
			ever := map[uint64]uint64{}
			for _, b := range a {
				ever[b.Hash] = b.Canonical
			}
			e.DropNext(4)
			require.NoError(t, e.Remove(a[1].Hash)) // lost
			c, err := e.Store(a[0].Hash, 1)         // lost: its parent is known
			require.NoError(t, err)
			require.NoError(t, e.Heartbeat())
			require.NoError(t, e.Heartbeat())
			for _, b := range c {
				ever[b.Hash] = b.Canonical
			}
			d, err := e.Store(c[0].Hash, 1) // heard, but its parent was lost: dropped
			require.NoError(t, err)
			f, err := e.Store(0, 2) // heard: a new root
			require.NoError(t, err)
			for _, b := range append(d, f...) {
				ever[b.Hash] = b.Canonical
			}
			r := hs.publishUntilSeen(e, 0)
			st := hs.src.Status()
			assert.Equal(t, RankDegraded, r.State)
			assert.Contains(t, r.Reason, "sequence gap")
			assert.Equal(t, base+1, st.Degraded)
			assert.Zero(t, hs.faults.Load(), "a degraded rank must not fault the pool")
			// The degraded state: what was heard since the reset, nothing stale.
			stats, err := hs.h.Stats(t.Context())
			require.NoError(t, err)
			assert.Equal(t, baseStats.DegradedResets+1, stats.DegradedResets)

			require.NoError(t, e.Clear())
			g, err := e.Store(0, 1)
			require.NoError(t, err)
			ever[g[0].Hash] = g[0].Canonical
			r = hs.publishUntilSeen(e, 0)
			assert.Equal(t, RankLive, r.State, "AllBlocksCleared makes a degraded rank exact again")
			hs.stop()
			requireNoStale(t, hs.pool, ever, e.Truth())
			requireExact(t, hs.pool, ckf.Member{WorkerID: 1}, e.Truth())
		})
	}
}

func TestSource_SilentEngineResetsThenRebuilds(t *testing.T) {
	pub, rep := endpoint(t, 1)
	e := startEngine(t, engine.Config{Endpoint: pub, Replay: rep})
	hs := newHarness(t, Config{Endpoint: pub, Replay: rep, Worker: 1, SourceTimeout: 150 * time.Millisecond})
	storeSome(t, e)
	hs.publishUntilSeen(e, 0)
	require.Eventually(t, func() bool {
		r, _ := rankOf(hs.src.Status(), 0)
		return r.State == RankReset
	}, 5*time.Second, 5*time.Millisecond)
	stats, err := hs.h.Stats(t.Context())
	require.NoError(t, err)
	assert.Zero(t, stats.Pool.UniqueBlocks, "a silent engine's blocks are withdrawn")
	assert.EqualValues(t, uint64(1), hs.src.Status().Silences)
	// It speaks again: the rank is rebuilt from the replay buffer.
	_, err = e.Store(0, 1)
	require.NoError(t, err)
	r := hs.publishUntilSeen(e, 0)
	assert.Equal(t, RankLive, r.State)
	hs.stop()
	requireExact(t, hs.pool, ckf.Member{WorkerID: 1}, e.Truth())
}

func TestSource_DuplicatesAndGarbageAreSkipped(t *testing.T) {
	pub, rep := endpoint(t, 1)
	e := startEngine(t, engine.Config{Endpoint: pub, Replay: rep})
	hs := newHarness(t, Config{Endpoint: pub, Replay: rep, Worker: 1})
	hs.publishUntilSeen(e, 0)
	a, err := e.Store(0, 2)
	require.NoError(t, err)
	require.NoError(t, e.Duplicate())
	require.NoError(t, e.Remove(a[1].Hash))
	require.NoError(t, e.Duplicate())
	for _, frames := range [][][]byte{
		{[]byte("x")},
		{{}, {1, 2}, {0x90}},
		{{}, {0, 0, 0, 0, 0, 0, 0, 9}, {0xc1}},
		{{}, {0, 0, 0, 0, 0, 0, 0, 9}, {0x92, 0xcb}},
	} {
		require.NoError(t, e.SendRaw(frames...))
	}
	hs.publishUntilSeen(e, 0)
	st := hs.src.Status()
	assert.EqualValues(t, uint64(2), st.Duplicates)
	assert.EqualValues(t, uint64(4), st.Rejected)
	assert.Zero(t, st.Restarts)
	hs.stop()
	requireExact(t, hs.pool, ckf.Member{WorkerID: 1}, e.Truth())
}

func TestSource_DPRanksOnConsecutivePorts(t *testing.T) {
	pub, rep := endpoint(t, 2)
	pub1, _ := RankEndpoint(pub, 1)
	rep1, _ := RankEndpoint(rep, 1)
	e0 := startEngine(t, engine.Config{Endpoint: pub, Replay: rep, DPRank: 0, Seed: 1})
	e1 := startEngine(t, engine.Config{Endpoint: pub1, Replay: rep1, DPRank: 1, Seed: 2, OmitDPRank: true})
	hs := newHarness(t, Config{Endpoint: pub, Replay: rep, DPRanks: 2, Worker: 9})
	storeSome(t, e0)
	e1.DropNext(1)
	storeSome(t, e1)
	hs.publishUntilSeen(e0, 0)
	hs.publishUntilSeen(e1, 1)
	hs.stop()
	requireExact(t, hs.pool, ckf.Member{WorkerID: 9, DPRank: 0}, e0.Truth())
	requireExact(t, hs.pool, ckf.Member{WorkerID: 9, DPRank: 1}, e1.Truth())
}

func TestSource_BindManyEnginesConnect(t *testing.T) {
	bind, rep := endpoint(t, 2)
	hs := newHarness(t, Config{Bind: bind, Replay: rep, DPRanks: 2, Worker: 4})
	rep1, _ := RankEndpoint(rep, 1)
	e0 := startEngine(t, engine.Config{Endpoint: bind, Connect: true, Replay: rep, DPRank: 0, Seed: 3, Form: engine.Named})
	e1 := startEngine(t, engine.Config{Endpoint: bind, Connect: true, Replay: rep1, DPRank: 1, Seed: 4})
	storeSome(t, e0)
	storeSome(t, e1)
	hs.publishUntilSeen(e0, 0)
	hs.publishUntilSeen(e1, 1)
	hs.stop()
	requireExact(t, hs.pool, ckf.Member{WorkerID: 4, DPRank: 0}, e0.Truth())
	requireExact(t, hs.pool, ckf.Member{WorkerID: 4, DPRank: 1}, e1.Truth())
}
