package main

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
