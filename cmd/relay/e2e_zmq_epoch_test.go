package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/sim/engine"
	"github.com/ckfrelay/ckfrelay/internal/source"
)

// zmqEngineRelay runs an emulated engine (PUB + replay) and returns it with
// the relay --source flag that connects to it.
func zmqEngineRelay(t *testing.T) (*engine.Engine, string) {
	t.Helper()
	base, err := engine.FreePorts(2)
	require.NoError(t, err)
	pub, rep := fmt.Sprintf("tcp://127.0.0.1:%d", base), fmt.Sprintf("tcp://127.0.0.1:%d", base+1)
	e, err := engine.Start(engine.Config{Endpoint: pub, Replay: rep})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e, fmt.Sprintf("dc-a:engine=vllm,endpoint=%s,replay=%s,worker=3,block_size=16", pub, rep)
}

// waitSource polls the catalog (the engine heartbeating) until ok.
func waitSource(t *testing.T, e *engine.Engine, base, what string, ok func(st source.Status, blocks int) bool) {
	t.Helper()
	require.Eventually(t, func() bool {
		_ = e.Heartbeat()
		return ok(sourceOf(t, base, "dc-a"))
	}, 20*time.Second, 20*time.Millisecond, what)
}

// A relay restarted on its data dir resumes a ZMQ source above the member
// epoch it recovered: an engine continuing mid-stream is rebuilt from its
// replay buffer, and one starting over at seq 0 is tracked.
func TestE2E_ZMQSourceResumesAboveRecoveredEpochs(t *testing.T) {
	e, src := zmqEngineRelay(t)
	args := []string{"--listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--pool", "dc-a:dc=1,expected=65536", "--source", src}
	rl := startRelay(t, args...)
	_, err := e.Store(0, 5)
	require.NoError(t, err)
	waitSource(t, e, rl.base, "5 blocks", func(st source.Status, blocks int) bool { return blocks == 5 })
	require.NoError(t, e.Restart()) // the member's epoch becomes 2
	_, err = e.Store(0, 2)
	require.NoError(t, err)
	waitSource(t, e, rl.base, "the restarted engine's 2 blocks at epoch 2", func(st source.Status, blocks int) bool {
		return blocks == 2 && len(st.Ranks) == 1 && st.Ranks[0].Epoch == 2
	})
	rl.kill()

	// The engine goes on mid-stream while the relay is down.
	_, err = e.Store(0, 3)
	require.NoError(t, err)
	rl = startRelay(t, args...)
	waitSource(t, e, rl.base, "the engine's 5 blocks, live, above epoch 2", func(st source.Status, blocks int) bool {
		return blocks == 5 && st.State == "live" && len(st.Ranks) == 1 && st.Ranks[0].Epoch > 2
	})
	rl.kill()

	// The engine starts over while the relay is down.
	require.NoError(t, e.Restart())
	_, err = e.Store(0, 4)
	require.NoError(t, err)
	rl = startRelay(t, args...)
	waitSource(t, e, rl.base, "the new lifetime's 4 blocks, live", func(st source.Status, blocks int) bool {
		return blocks == 4 && st.State == "live" && len(st.Ranks) == 1 && st.Ranks[0].Epoch > 3
	})
}

// An HTTP ranks/reset at a high epoch for a member a ZMQ source owns does
// not stop the source: it adopts an epoch above it, at once (the reset
// dropped the member's blocks: the rank is rebuilt degraded) and at the
// engine's next restart.
func TestE2E_ZMQSourceAdoptsAnEpochRaisedOverHTTP(t *testing.T) {
	e, src := zmqEngineRelay(t)
	rl := startRelay(t, "--listen", "127.0.0.1:0", "--pool", "dc-a:dc=1,expected=65536", "--source", src)
	_, err := e.Store(0, 5)
	require.NoError(t, err)
	waitSource(t, e, rl.base, "5 blocks", func(st source.Status, blocks int) bool { return blocks == 5 })

	code, body := postJSON(t, rl.base+"/v1/pools/dc-a/ranks/reset", `{"worker_id": 3, "dp_rank": 0, "source_epoch": 1000}`)
	require.Less(t, code, 300, body)
	_, err = e.Store(0, 3)
	require.NoError(t, err)
	waitSource(t, e, rl.base, "the blocks stored after the reset, above epoch 1000", func(st source.Status, blocks int) bool {
		return blocks == 3 && st.State != "stopped" && st.Ranks[0].Epoch > 1000
	})

	require.NoError(t, e.Restart())
	_, err = e.Store(0, 2)
	require.NoError(t, err)
	waitSource(t, e, rl.base, "the restarted engine's 2 blocks, live", func(st source.Status, blocks int) bool {
		return blocks == 2 && st.State == "live" && st.Ranks[0].Epoch > 1001
	})
}
