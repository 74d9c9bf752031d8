package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/sim/engine"
	"github.com/ckfrelay/ckfrelay/internal/source"
	"github.com/ckfrelay/ckfrelay/internal/source/zmq"
	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
)

// An engine's blocks reach a remote subscriber of the pool its ZMQ source
// feeds, and the catalog and metrics show the source.
func TestServer_ZMQSourceFeedsPool(t *testing.T) {
	base, err := engine.FreePorts(2)
	require.NoError(t, err)
	pub, rep := fmt.Sprintf("tcp://127.0.0.1:%d", base), fmt.Sprintf("tcp://127.0.0.1:%d", base+1)
	e, err := engine.Start(engine.Config{Endpoint: pub, Replay: rep, BlockSize: 16})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })

	cfg := testConfig()
	cfg.Pools[0].Sources = []SourceSpec{{Engine: "vllm", Endpoint: pub, Replay: rep, Worker: 7, BlockSize: 16}}
	srv, ts := startTestServer(t, cfg)
	sr, resp := openStream(t, ts.URL, "dc-a", 1, 0, 1)
	defer resp.Body.Close()

	var st source.Status
	require.Eventually(t, func() bool {
		require.NoError(t, e.Heartbeat())
		time.Sleep(5 * time.Millisecond)
		sts := srv.SourceStatuses("dc-a")
		require.Len(t, sts, 1)
		st = sts[0]
		return len(st.Ranks) == 1 && int64(st.Ranks[0].Seq) == e.Seq()
	}, 10*time.Second, time.Millisecond)
	blocks, err := e.Store(0, 3)
	require.NoError(t, err)
	format, err := cfg.WithDefaults().Pools[0].Format()
	require.NoError(t, err)
	last := blocks[2].Canonical
	for sr.words == nil || !sr.contains(format, last) {
		sr.next()
	}

	r, err := http.Get(ts.URL + "/v1/pools")
	require.NoError(t, err)
	var cat struct {
		Pools []catalogPool `json:"pools"`
	}
	require.NoError(t, json.NewDecoder(r.Body).Decode(&cat))
	r.Body.Close()
	require.Len(t, cat.Pools[0].Sources, 1)
	got := cat.Pools[0].Sources[0]
	assert.Equal(t, "vllm@"+pub, got.Name)
	assert.Equal(t, "live", got.State)
	assert.Empty(t, cat.Pools[1].Sources)

	// A batch whose only event has another block size: a drop by reason.
	dropped, err := e.EncodeBatch(engine.Event{Type: "BlockStored", BlockHashes: []uint64{1 << 40}, TokenIDs: make([]uint32, 8), BlockSize: 8})
	require.NoError(t, err)
	require.NoError(t, e.PublishEncoded(dropped))
	require.Eventually(t, func() bool {
		return srv.SourceStatuses("dc-a")[0].DroppedByReason["block_size"] == 1
	}, 10*time.Second, time.Millisecond)

	r, err = http.Get(ts.URL + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	assert.Contains(t, string(body), `ckfrelay_source_batches_total{engine="vllm",pool="dc-a",source="vllm@`+pub+`"}`)
	assert.Contains(t, string(body), `ckfrelay_source_rank_state{dp_rank="0",engine="vllm",pool="dc-a",source="vllm@`+pub+`",state="live"} 1`)
	assert.Contains(t, string(body), `ckfrelay_source_dropped_reason_total{engine="vllm",pool="dc-a",reason="block_size",source="vllm@`+pub+`"} 1`)
	assert.Contains(t, string(body), `ckfrelay_source_failing{engine="vllm",pool="dc-a",source="vllm@`+pub+`"} 0`)
	assert.Contains(t, string(body), `ckfrelay_source_held{engine="vllm",pool="dc-a",source="vllm@`+pub+`"} 0`)
	assert.Contains(t, string(body), `ckfrelay_source_reordered_total{engine="vllm",pool="dc-a",source="vllm@`+pub+`"} 0`)
}

func TestServer_BadSourceFailsNew(t *testing.T) {
	for _, spec := range []SourceSpec{
		{Engine: "mystery", Endpoint: "tcp://127.0.0.1:1"},
		{Engine: "vllm", BlockSize: 16},
		{Engine: "vllm", Endpoint: "tcp://127.0.0.1:1"}, // no block size
		{Engine: "vllm", Endpoint: "tcp://127.0.0.1:1", BlockSize: 16, URL: "nats://x"},
		{Engine: "vllm", Endpoint: "udp://x:1", BlockSize: 16},
	} {
		cfg := testConfig()
		cfg.Pools[0].Sources = []SourceSpec{spec}
		_, err := New(cfg, nil)
		require.ErrorIs(t, err, ErrInvalidConfig, "%+v", spec)
	}
}

func TestParseSourceFlag(t *testing.T) {
	pool, spec, err := ParseSourceFlag("dc-a:engine=vllm,endpoint=tcp://h:5557,replay=tcp://h:5558,worker=7,block_size=16,dp_ranks=2,topic=kv,source_timeout=5s")
	require.NoError(t, err)
	assert.Equal(t, "dc-a", pool)
	assert.Equal(t, SourceSpec{Engine: "vllm", Endpoint: "tcp://h:5557", Replay: "tcp://h:5558", Worker: 7,
		BlockSize: 16, DPRanks: 2, Topic: "kv", SourceTimeout: Duration(5 * time.Second)}, spec)
	_, spec, err = ParseSourceFlag("dc-b:engine=sglang,bind=tcp://*:5557,block_size=32")
	require.NoError(t, err)
	assert.Equal(t, "tcp://*:5557", spec.Bind)
	_, dyn, err := ParseSourceFlag("dc-c:engine=dynamo,url=nats://127.0.0.1:4222,subject=namespace.dynamo.kv_events,stream=kv,durable=relay-c")
	require.NoError(t, err)
	assert.Equal(t, SourceSpec{Engine: "dynamo", URL: "nats://127.0.0.1:4222", Subject: "namespace.dynamo.kv_events",
		Stream: "kv", Durable: "relay-c"}, dyn)
	src, err := newSource(dyn, PoolSpec{}, testConfig().WithDefaults(), nil)
	require.NoError(t, err, "a dynamo spec builds the NATS source")
	assert.Equal(t, "dynamo", src.Status().Engine)
	_, err = newSource(SourceSpec{Engine: "dynamo", URL: "nats://h", Subject: "s", Endpoint: "tcp://h:1"}, PoolSpec{}, testConfig().WithDefaults(), nil)
	require.Error(t, err, "ZMQ fields on a dynamo source are refused")
	for _, bad := range []string{"dc-a", "dc-a:", "dc-a:endpoint=tcp://h:1", "dc-a:engine=vllm,worker=x", "dc-a:engine=vllm,colour=red", "dc-a:engine"} {
		_, _, err := ParseSourceFlag(bad)
		require.ErrorIs(t, err, ErrInvalidConfig, bad)
	}
	cfg := testConfig()
	require.NoError(t, cfg.AddSource("dc-b", spec))
	assert.Len(t, cfg.Pools[1].Sources, 1)
	require.ErrorIs(t, cfg.AddSource("nope", spec), ErrInvalidConfig)
}

func FuzzParseSourceFlag(f *testing.F) {
	f.Add("dc-a:engine=vllm,endpoint=tcp://h:5557,replay=tcp://h:5558,worker=7,block_size=16")
	f.Add("dc-b:engine=sglang,bind=tcp://*:1,dp_ranks=3,source_timeout=1s,topic=x")
	f.Fuzz(func(t *testing.T, s string) {
		pool, spec, err := ParseSourceFlag(s)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidConfig)
			return
		}
		require.NotEmpty(t, spec.Engine)
		// A parsed spec either builds a source or is refused with a
		// configuration error, never a panic.
		if _, err := newSource(spec, PoolSpec{}, Config{}.WithDefaults(), nil); err != nil {
			require.NotEmpty(t, err.Error())
		}
		_ = pool
	})
}

// TestSource_IngestOptionsReachTheSource: image_token_id, video_token_id, fail_window and
// max_namespace_blocks from a --source flag (and so from JSON, the same
// SourceSpec) reach the ZMQ source, with the pool's block size and hash
// format; negative values and the keys on a dynamo source are refused.
func TestSource_IngestOptionsReachTheSource(t *testing.T) {
	_, spec, err := ParseSourceFlag("dc-a:engine=vllm,endpoint=tcp://127.0.0.1:5557,image_token_id=32000,video_token_id=32001,fail_window=250ms,max_namespace_blocks=4096,max_replay_bytes=1048576")
	require.NoError(t, err)
	require.NotNil(t, spec.ImageTokenID)
	assert.Equal(t, uint32(32000), *spec.ImageTokenID)
	src, err := newSource(spec, PoolSpec{BlockSize: 16, HashFormat: HashFormatEagle}, testConfig().WithDefaults(), nil)
	require.NoError(t, err)
	zs, ok := src.(*zmq.Source)
	require.True(t, ok, "a vllm spec builds the ZMQ source")
	c := zs.Config()
	require.NotNil(t, c.Ingest.ImageTokenID)
	assert.Equal(t, uint32(32000), *c.Ingest.ImageTokenID)
	require.NotNil(t, c.Ingest.VideoTokenID)
	assert.Equal(t, uint32(32001), *c.Ingest.VideoTokenID)
	assert.Equal(t, 250*time.Millisecond, c.Ingest.FailWindow)
	assert.Equal(t, 4096, c.Ingest.MaxNamespaceBlocks)
	assert.EqualValues(t, 1<<20, c.MaxReplayBytes)
	assert.Equal(t, 16, c.BlockSize, "the pool's block size")
	assert.True(t, c.Eagle, "the pool's hash format")

	var fromJSON SourceSpec
	require.NoError(t, json.Unmarshal([]byte(`{"engine":"vllm","endpoint":"tcp://127.0.0.1:5557","block_size":16,
		"image_token_id":32000,"video_token_id":32001,"fail_window":"250ms","max_namespace_blocks":4096}`), &fromJSON))
	assert.Equal(t, spec.ImageTokenID, fromJSON.ImageTokenID)
	assert.Equal(t, spec.VideoTokenID, fromJSON.VideoTokenID)
	assert.Equal(t, spec.FailWindow, fromJSON.FailWindow)
	assert.Equal(t, spec.MaxNamespaceBlocks, fromJSON.MaxNamespaceBlocks)

	for _, bad := range []string{
		"dc-a:engine=vllm,endpoint=tcp://127.0.0.1:5557,block_size=16,fail_window=-1s",
		"dc-a:engine=vllm,endpoint=tcp://127.0.0.1:5557,block_size=16,max_namespace_blocks=-1",
		"dc-a:engine=dynamo,url=nats://h,subject=s,image_token_id=5",
		"dc-a:engine=dynamo,url=nats://h,subject=s,video_token_id=5",
		"dc-a:engine=dynamo,url=nats://h,subject=s,fail_window=1s",
		"dc-a:engine=dynamo,url=nats://h,subject=s,max_replay_bytes=5",
		"dc-a:engine=vllm,endpoint=tcp://127.0.0.1:5557,block_size=16,max_replay_bytes=-1",
	} {
		_, spec, err := ParseSourceFlag(bad)
		require.NoError(t, err, bad)
		_, err = newSource(spec, PoolSpec{}, testConfig().WithDefaults(), nil)
		assert.Error(t, err, bad)
	}
	for _, bad := range []string{"dc-a:engine=vllm,image_token_id=x", "dc-a:engine=vllm,image_token_id=4294967296", "dc-a:engine=vllm,fail_window=soon"} {
		_, _, err := ParseSourceFlag(bad)
		assert.ErrorIs(t, err, ErrInvalidConfig, bad)
	}
}

// A clean shutdown stops every source without an ERROR line: the source
// that returns its context's error when it is stopped (the Dynamo source)
// said "source stopped … context canceled" at ERROR on every SIGTERM.
func TestServer_ShutdownStopsSourcesWithoutAnError(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	cfg := testConfig()
	cfg.Pools[0].Sources = []SourceSpec{{Engine: "dynamo", URL: ns.URL(), Subject: "namespace.dynamo.kv_events"}}
	var logs lockedBuffer
	srv, err := New(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		sts := srv.SourceStatuses("dc-a")
		return len(sts) == 1 && sts[0].State == "live"
	}, 10*time.Second, time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, srv.Shutdown(ctx))
	assert.NotContains(t, logs.String(), "level=ERROR")
}
