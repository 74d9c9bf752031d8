package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
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
	logs := serveOnce(t, "--pool", "dc-a:dc=1,expected=65536", "--pool", "dc-b:dc=2,expected=65536,block_size=32")
	assert.Contains(t, logs, "cannot share a router")
	assert.Contains(t, logs, `"pool":"dc-b"`)
	assert.Contains(t, logs, "block_size")

	// Pools of other sizes (formats) share a router: each lane has its own
	// format (issue #35).
	logs = serveOnce(t, "--pool", "dc-a:dc=1,expected=65536", "--pool", "dc-b:dc=2,expected=262144")
	assert.NotContains(t, logs, "cannot share a router")
	// Two models in one data center: pools of two domains, which a router
	// selects apart (issue #32).
	logs = serveOnce(t, "--pool", "llama:dc=1,expected=65536,cache_semantics=llama", "--pool", "qwen:dc=1,expected=65536,cache_semantics=qwen,block_size=32")
	assert.NotContains(t, logs, "cannot share a router")
}
