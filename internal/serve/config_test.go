package serve

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/server"
)

func TestServeConfig_AuthTokenSources(t *testing.T) {
	file := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(file, []byte("from-file\n"), 0o600))
	tests := []struct {
		name            string
		env             map[string]string
		args            []string
		token, fromFile string
	}{
		{"flag file", nil, []string{"--auth-token-file", file}, "", file},
		{"env file", map[string]string{"CKFRELAY_AUTH_TOKEN_FILE": file}, nil, "", file},
		{"flag token beats env file", map[string]string{"CKFRELAY_AUTH_TOKEN_FILE": file}, []string{"--auth-token", "x"}, "x", ""},
		{"flag file beats env token", map[string]string{"CKFRELAY_AUTH_TOKEN": "y"}, []string{"--auth-token-file", file}, "", file},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{"CKFRELAY_AUTH_TOKEN", "CKFRELAY_AUTH_TOKEN_FILE", "CKFRELAY_CONFIG", "CKFRELAY_POOLS"} {
				t.Setenv(k, "")
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			cfg, _, err := parseConfig(append(tc.args, "--pool", "a:dc=1"), io.Discard)
			require.NoError(t, err)
			assert.Equal(t, tc.token, cfg.AuthToken)
			assert.Equal(t, tc.fromFile, cfg.AuthTokenFile)
			resolved, err := cfg.ResolveAuthToken()
			require.NoError(t, err)
			if tc.fromFile != "" {
				assert.Equal(t, "from-file", resolved.AuthToken)
			}
		})
	}
}

func TestServeConfig_Sources(t *testing.T) {
	cfg, _, err := parseConfig([]string{"--pool", "dc-a:dc=1", "--pool", "dc-b:dc=2",
		"--source", "dc-b:engine=vllm,endpoint=tcp://10.0.0.5:5557,replay=tcp://10.0.0.5:5558,worker=7,block_size=16"}, io.Discard)
	require.NoError(t, err)
	assert.Empty(t, cfg.Pools[0].Sources)
	assert.Equal(t, []server.SourceSpec{{Engine: "vllm", Endpoint: "tcp://10.0.0.5:5557", Replay: "tcp://10.0.0.5:5558",
		Worker: 7, BlockSize: 16}}, cfg.Pools[1].Sources)

	t.Setenv("CKFRELAY_SOURCES", "dc-a:engine=sglang,bind=tcp://127.0.0.1:5557,block_size=32; dc-a:engine=trtllm,endpoint=tcp://h:1,block_size=32")
	cfg, _, err = parseConfig([]string{"--pool", "dc-a:dc=1"}, io.Discard)
	require.NoError(t, err)
	require.Len(t, cfg.Pools[0].Sources, 2)
	assert.Equal(t, "trtllm", cfg.Pools[0].Sources[1].Engine)

	_, _, err = parseConfig([]string{"--pool", "dc-a:dc=1", "--source", "dc-z:engine=vllm,endpoint=tcp://h:1"}, io.Discard)
	require.ErrorIs(t, err, server.ErrInvalidConfig)
}

func TestServeConfig_HA(t *testing.T) {
	for _, k := range []string{"CKFRELAY_CONFIG", "CKFRELAY_POOLS", "CKFRELAY_HA_NATS_URL", "CKFRELAY_HA_NODE_ID", "CKFRELAY_DATA_DIR"} {
		t.Setenv(k, "")
	}
	cfg, _, err := parseConfig([]string{"--pool", "a:dc=1"}, io.Discard)
	require.NoError(t, err)
	assert.False(t, cfg.HA.Enabled(), "HA is off unless ha.nats_url is set")

	t.Setenv("CKFRELAY_HA_NATS_URL", "nats://env:4222")
	cfg, _, err = parseConfig([]string{"--pool", "a:dc=1"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "nats://env:4222", cfg.HA.NATSURL)
	host, _ := os.Hostname()
	assert.Equal(t, host, cfg.HA.NodeID, "node id defaults to the host name")
	assert.Equal(t, 3, cfg.HA.StreamReplicas)

	cfg, _, err = parseConfig([]string{"--pool", "a:dc=1", "--ha-nats-url", "nats://flag:4222", "--node-id", "relay-2"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "nats://flag:4222", cfg.HA.NATSURL, "the flag beats the environment")
	assert.Equal(t, "relay-2", cfg.HA.NodeID)

	file := filepath.Join(t.TempDir(), "relay.json")
	require.NoError(t, os.WriteFile(file, []byte(`{"pools": [{"name": "a", "dc_id": 1}],
		"ha": {"nats_url": "nats://file:4222", "node_id": "n1", "lease_ttl": "2s", "stream_replicas": 5, "advertise": "http://10.0.0.7:7878",
		        "checkpoint_records": 5000, "checkpoint_bytes": 8388608}}`), 0o600))
	t.Setenv("CKFRELAY_HA_NATS_URL", "")
	cfg, _, err = parseConfig([]string{"--config", file}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, server.HAConfig{NATSURL: "nats://file:4222", NodeID: "n1", LeaseTTL: server.Duration(2e9), StreamReplicas: 5,
		Advertise: "http://10.0.0.7:7878", CheckpointRecords: 5000, CheckpointBytes: 8 << 20}, cfg.HA)
	require.NoError(t, cfg.Validate())

	// HA and a data dir exclude each other.
	cfg, _, err = parseConfig([]string{"--config", file, "--data-dir", t.TempDir()}, io.Discard)
	require.NoError(t, err)
	require.ErrorIs(t, cfg.Validate(), server.ErrInvalidConfig)
}
