package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/sim/engine"
	"github.com/ckfrelay/ckfrelay/internal/source"
)

// sourceOf reads the catalog's first source of pool.
func sourceOf(t *testing.T, base, pool string) (source.Status, int) {
	t.Helper()
	resp, err := http.Get(base + "/v1/pools")
	require.NoError(t, err)
	defer resp.Body.Close()
	var c struct {
		Pools []struct {
			Name    string          `json:"name"`
			Sources []source.Status `json:"sources"`
			Stats   *struct {
				UniqueBlocks int `json:"unique_blocks"`
			} `json:"stats"`
		} `json:"pools"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&c))
	for _, p := range c.Pools {
		if p.Name == pool && len(p.Sources) > 0 && p.Stats != nil {
			return p.Sources[0], p.Stats.UniqueBlocks
		}
	}
	require.Fail(t, fmt.Sprintf("pool %q has no source in the catalog", pool))
	return source.Status{}, 0
}

// The relay binary, configured by --source, hears an engine over ZMQ: its
// blocks, a restart (new epoch, the dead lifetime's blocks withdrawn) and
// its death (silence past source_timeout withdraws everything).
func TestE2E_ZMQEngineLifecycle(t *testing.T) {
	base, err := engine.FreePorts(2)
	require.NoError(t, err)
	pub, rep := fmt.Sprintf("tcp://127.0.0.1:%d", base), fmt.Sprintf("tcp://127.0.0.1:%d", base+1)
	rl := startRelay(t, "--listen", "127.0.0.1:0", "--pool", "dc-a:dc=1,expected=65536",
		"--source", fmt.Sprintf("dc-a:engine=vllm,endpoint=%s,replay=%s,worker=3,block_size=16,source_timeout=400ms", pub, rep))
	e, err := engine.Start(engine.Config{Endpoint: pub, Replay: rep, PublisherID: true})
	require.NoError(t, err)
	defer e.Close()

	wait := func(what string, ok func(st source.Status, blocks int) bool) {
		t.Helper()
		require.Eventually(t, func() bool {
			_ = e.Heartbeat()
			st, blocks := sourceOf(t, rl.base, "dc-a")
			return ok(st, blocks)
		}, 20*time.Second, 20*time.Millisecond, what)
	}
	_, err = e.Store(0, 5)
	require.NoError(t, err)
	wait("the engine's 5 blocks", func(st source.Status, blocks int) bool {
		return blocks == 5 && len(st.Ranks) == 1 && st.Ranks[0].State == "live"
	})

	require.NoError(t, e.Restart())
	_, err = e.Store(0, 2)
	require.NoError(t, err)
	wait("the restarted engine's 2 blocks only", func(st source.Status, blocks int) bool {
		return blocks == 2 && st.Restarts >= 1 && st.Ranks[0].Epoch >= 2
	})

	require.NoError(t, e.Close())
	require.Eventually(t, func() bool {
		st, blocks := sourceOf(t, rl.base, "dc-a")
		return blocks == 0 && st.Silences >= 1 && st.Ranks[0].State == "reset" && st.State == "connecting"
	}, 20*time.Second, 20*time.Millisecond, "a dead engine's blocks are withdrawn")
	require.Positive(t, metricValue(t, rl.base, `ckfrelay_source_silences_total{engine="vllm",pool="dc-a",source="vllm@`+pub+`"}`))
}
