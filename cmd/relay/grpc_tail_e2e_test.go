package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/server"
	"github.com/ckfrelay/ckfrelay/internal/testing/streamtable"
)

// TestBlackBox_TailGRPCMultiPoolRelay runs the relay binary with pools
// {dc 1, llama}, {dc 1, qwen}, {dc 2, llama} (one indexer domain per model,
// as a Dynamo relay hosts them) and `relay tail --grpc ADDR --model llama`
// (the binary again): the catalog lines select exactly the two llama pools,
// and the frames of each carry its dc_id and sequence, the snapshot equal
// to that pool's table.
func TestBlackBox_TailGRPCMultiPoolRelay(t *testing.T) {
	pool := func(name string, dc uint64, model string) server.PoolSpec {
		return server.PoolSpec{Name: name, DCID: dc, ExpectedBlocks: 256, CacheSemantics: model,
			KvRelay: server.KvPoolSpec{Roles: []string{"aggregated"}, Models: []server.ModelSpec{{ID: model}}}}
	}
	base, addr := grpcRelay(t, server.Config{HeartbeatInterval: server.Duration(50 * time.Millisecond),
		Pools: []server.PoolSpec{pool("llama-1", 1, "llama"), pool("qwen-1", 1, "qwen"), pool("llama-2", 2, "llama")}})
	for i, p := range []string{"llama-1", "qwen-1", "llama-2"} {
		ev := fmt.Sprintf(`[{"worker_id": 1, "event": {"event_id": 1, "data": {"stored": {"parent_hash": null, "blocks": [{"block_hash": %d, "tokens_hash": %d}]}}}}]`, 100+i, 200+i)
		resp, err := http.Post(base+"/v1/pools/"+p+"/events?source_epoch=1", "application/json", strings.NewReader(ev))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusAccepted, resp.StatusCode)
	}
	want := map[string][]uint64{"1": streamtable.At(t, base, "llama-1", 90, 1, 10*time.Second), "2": streamtable.At(t, base, "llama-2", 90, 1, 10*time.Second)}

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, relayBinary(t), "tail", "--grpc", addr, "--model", "llama", "--frames", "2")
	cmd.Stdout, cmd.Stderr = &out, &errb
	require.NoError(t, cmd.Run(), "stderr %q", errb.String())

	type line struct {
		Kind          string   `json:"kind"`
		DCID          string   `json:"dc_id"`
		Sequence      string   `json:"sequence"`
		Selected      bool     `json:"selected"`
		Words         []string `json:"words"`
		Registrations []struct {
			ID string `json:"canonical_model_id"`
		} `json:"registrations"`
	}
	selected, frames := map[string]string{}, map[string]int{}
	sc := bufio.NewScanner(&out)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var l line
		require.NoError(t, json.Unmarshal(sc.Bytes(), &l), "%s", sc.Text())
		require.NotEmpty(t, l.DCID, "every line carries dc_id: %s", sc.Text())
		switch l.Kind {
		case "catalog_pool":
			if l.Selected {
				selected[l.DCID] = l.Registrations[0].ID
			}
		case "snapshot_chunk":
			require.NotEmpty(t, l.Sequence)
			words := make([]uint64, len(l.Words))
			for i, w := range l.Words {
				v, err := strconv.ParseUint(w, 16, 64)
				require.NoError(t, err)
				words[i] = v
			}
			assert.Equal(t, want[l.DCID], words, "dc %s: the snapshot is llama's table", l.DCID)
			frames[l.DCID]++
		default:
			require.NotEmpty(t, l.Sequence)
			frames[l.DCID]++
		}
	}
	assert.Equal(t, map[string]string{"1": "llama", "2": "llama"}, selected)
	assert.Equal(t, map[string]int{"1": 2, "2": 2}, frames)
}
