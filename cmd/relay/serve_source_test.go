package main

import (
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/server"
)

func TestServeConfig_Sources(t *testing.T) {
	cfg, _, err := serveConfig([]string{"--pool", "dc-a:dc=1", "--pool", "dc-b:dc=2",
		"--source", "dc-b:engine=vllm,endpoint=tcp://10.0.0.5:5557,replay=tcp://10.0.0.5:5558,worker=7,block_size=16"}, io.Discard)
	require.NoError(t, err)
	assert.Empty(t, cfg.Pools[0].Sources)
	assert.Equal(t, []server.SourceSpec{{Engine: "vllm", Endpoint: "tcp://10.0.0.5:5557", Replay: "tcp://10.0.0.5:5558",
		Worker: 7, BlockSize: 16}}, cfg.Pools[1].Sources)

	t.Setenv("CKFRELAY_SOURCES", "dc-a:engine=sglang,bind=tcp://127.0.0.1:5557,block_size=32; dc-a:engine=trtllm,endpoint=tcp://h:1,block_size=32")
	cfg, _, err = serveConfig([]string{"--pool", "dc-a:dc=1"}, io.Discard)
	require.NoError(t, err)
	require.Len(t, cfg.Pools[0].Sources, 2)
	assert.Equal(t, "trtllm", cfg.Pools[0].Sources[1].Engine)

	_, _, err = serveConfig([]string{"--pool", "dc-a:dc=1", "--source", "dc-z:engine=vllm,endpoint=tcp://h:1"}, io.Discard)
	require.ErrorIs(t, err, server.ErrInvalidConfig)
}
