package tail

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/grpcserver"
	"github.com/ckfrelay/ckfrelay/internal/server"
)

// startGRPCRelay runs a relay hosting {dc 1, llama}, {dc 1, qwen} and
// {dc 2, llama} (one indexer domain per model) and returns its gRPC address.
func startGRPCRelay(t *testing.T) string {
	t.Helper()
	pool := func(name string, dc uint64, model string) server.PoolSpec {
		return server.PoolSpec{Name: name, DCID: dc, ExpectedBlocks: 256, CacheSemantics: model,
			KvRelay: server.KvPoolSpec{Roles: []string{"aggregated"}, Models: []server.ModelSpec{{ID: model}}}}
	}
	cfg := server.Config{HeartbeatInterval: server.Duration(20 * time.Millisecond),
		GRPC:  server.GRPCConfig{Listen: "127.0.0.1:0", LoadInterval: server.Duration(20 * time.Millisecond)},
		Pools: []server.PoolSpec{pool("llama-1", 1, "llama"), pool("qwen-1", 1, "qwen"), pool("llama-2", 2, "llama")}}
	log := slog.New(slog.DiscardHandler)
	srv, err := server.New(cfg, log)
	require.NoError(t, err)
	g, err := grpcserver.New(srv, log)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- g.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		assert.NoError(t, srv.Shutdown(ctx))
		assert.NoError(t, g.Shutdown(ctx))
		assert.NoError(t, <-served)
	})
	return ln.Addr().String()
}

type tailLine struct {
	Kind           string `json:"kind"`
	DCID           string `json:"dc_id"`
	Sequence       string `json:"sequence"`
	Selected       bool   `json:"selected"`
	Why            string `json:"why"`
	CacheSemantics string `json:"cache_semantics"`
	Registrations  []struct {
		ID string `json:"canonical_model_id"`
	} `json:"registrations"`
}

func tailGRPC(t *testing.T, args ...string) []tailLine {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	require.NoError(t, Run(ctx, args, &out, &errb), "stderr %q", errb.String())
	var got []tailLine
	sc := bufio.NewScanner(&out)
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var l tailLine
		require.NoError(t, json.Unmarshal(sc.Bytes(), &l), "%s", sc.Text())
		got = append(got, l)
	}
	return got
}

// TestTailGRPC_SelectsAsTheClient: `relay tail --grpc ADDR --model llama`
// against a relay with pools {dc 1, llama}, {dc 1, qwen}, {dc 2, llama}
// prints the catalog with exactly the two llama pools selected, then those
// pools' frames, each with its dc_id and sequence.
func TestTailGRPC_SelectsAsTheClient(t *testing.T) {
	addr := startGRPCRelay(t)
	got := tailGRPC(t, "--grpc", addr, "--model", "llama", "--frames", "3")
	var catalog []tailLine
	frames := map[string][]tailLine{}
	for _, l := range got {
		if l.Kind == "catalog_pool" {
			catalog = append(catalog, l)
			continue
		}
		require.NotEmpty(t, l.DCID, "%+v", l)
		require.NotEmpty(t, l.Sequence, "%+v", l)
		frames[l.DCID] = append(frames[l.DCID], l)
	}
	require.Len(t, catalog, 3)
	selected := map[string]string{}
	for _, c := range catalog {
		require.Len(t, c.Registrations, 1)
		if c.Selected {
			selected[c.DCID] = c.Registrations[0].ID
		} else {
			assert.Equal(t, "qwen", c.Registrations[0].ID)
			assert.Contains(t, c.Why, "does not match")
		}
	}
	assert.Equal(t, map[string]string{"1": "llama", "2": "llama"}, selected)
	require.Len(t, frames, 2, "frames of the two selected pools")
	for dc, fs := range frames {
		require.Len(t, fs, 3, "dc %s: --frames per pool", dc)
		assert.Equal(t, "snapshot_chunk", fs[0].Kind)
		assert.Equal(t, "heartbeat", fs[1].Kind)
	}

	// With no selection: the catalog only.
	got = tailGRPC(t, "--grpc", addr)
	require.Len(t, got, 3)
	for _, l := range got {
		assert.Equal(t, "catalog_pool", l.Kind)
		assert.False(t, l.Selected)
	}
	// --domain: qwen's cache-semantics digest selects qwen's one pool.
	qwen := ""
	for _, l := range got {
		if l.Registrations[0].ID == "qwen" {
			qwen = l.CacheSemantics
		}
	}
	got = tailGRPC(t, "--grpc", addr, "--domain", qwen, "--frames", "1")
	n := 0
	for _, l := range got {
		if l.Kind == "catalog_pool" && l.Selected {
			n++
			assert.Equal(t, "qwen", l.Registrations[0].ID)
		}
		if l.Kind == "snapshot_chunk" {
			assert.Equal(t, "1", l.DCID)
		}
	}
	assert.Equal(t, 1, n)
	var errb bytes.Buffer
	for _, bad := range [][]string{{"--grpc", addr, "--role", "decode", "--model", "m"}, {"--grpc", addr, "--namespace", "x"}, {"--grpc", addr, "--domain", "zz"}} {
		assert.ErrorIs(t, Run(t.Context(), bad, &bytes.Buffer{}, &errb), ErrUsage, "%v", bad)
	}
}
