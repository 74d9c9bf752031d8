package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// serveOnce starts `relay serve` with args, waits until it listens, stops it
// and returns what it logged.
func serveOnce(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	var logs bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- runServe(ctx, append([]string{"--listen", "127.0.0.1:0", "--log-level", "warn"}, args...), pw, &logs)
		pw.Close()
	}()
	sc := bufio.NewScanner(pr)
	require.True(t, sc.Scan(), "serve printed nothing")
	require.True(t, strings.HasPrefix(sc.Text(), "listening on "), sc.Text())
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	cancel()
	require.NoError(t, <-done)
	return logs.String()
}

func TestServe_WarnsWhenPoolsOfOneScopeCannotShareARouter(t *testing.T) {
	logs := serveOnce(t, "--pool", "dc-a:dc=1,expected=65536", "--pool", "dc-b:dc=2,expected=262144")
	assert.Contains(t, logs, "cannot share a router")
	assert.Contains(t, logs, `"pool":"dc-b"`)
	assert.Contains(t, logs, "bucket_count")

	logs = serveOnce(t, "--pool", "dc-a:dc=1,expected=65536", "--pool", "dc-b:dc=2,expected=65536")
	assert.NotContains(t, logs, "cannot share a router")
}

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
			cfg, _, err := serveConfig(append(tc.args, "--pool", "a:dc=1"), io.Discard)
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
