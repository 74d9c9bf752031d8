package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/server"
)

func TestRun_UsageErrorsExit2(t *testing.T) {
	tests := []struct {
		name string
		args []string
	}{
		{"no command", nil},
		{"unknown command", []string{"serf"}},
		{"serve bad flag", []string{"serve", "--no-such-flag"}},
		{"tail without pool", []string{"tail"}},
		{"tail bad flag", []string{"tail", "--pool", "p", "--frames", "x"}},
		{"demo bad consumer", []string{"demo", "--consumer", "python"}},
		{"demo too many dcs", []string{"demo", "--dcs", "17"}},
		{"demo zero duration", []string{"demo", "--duration", "0s"}},
		{"demo zero probes", []string{"demo", "--probes", "0"}},
		{"demo stray argument", []string{"demo", "now"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			got := run(context.Background(), tt.args, &out, &errb)
			assert.Equal(t, 2, got, "run(%q) = %d, want 2 (stderr %q)", tt.args, got, errb.String())
			assert.NotEqual(t, 0, errb.Len(), "run(%q) wrote nothing to stderr, want a usage message", tt.args)
		})
	}
}

func TestRun_HelpExits0(t *testing.T) {
	var out, errb bytes.Buffer
	got := run(context.Background(), []string{"help"}, &out, &errb)
	assert.False(t, got != 0 || !strings.Contains(out.String(), "usage: relay"), "run(help) = %d, stdout %q; want 0 and the usage", got, out.String())
}

func TestRun_ServeInvalidConfigExits1(t *testing.T) {
	var out, errb bytes.Buffer
	// A pool flag without dc= is a configuration error, not a usage error.
	got := run(context.Background(), []string{"serve", "--listen", "127.0.0.1:0", "--pool", "a:dc=1", "--pool", "a:dc=2"}, &out, &errb)
	assert.False(t, got != 1 || !strings.Contains(errb.String(), "duplicate pool name"), "run(serve, duplicate pools) = %d, stderr %q; want 1 naming the duplicate", got, errb.String())
}

// run tail against a live in-process relay: the snapshot's words are the
// relay's mirror.
func TestRun_TailAgainstRelay(t *testing.T) {
	srv, err := server.New(server.Config{Pools: []server.PoolSpec{{Name: "p", DCID: 1, ExpectedBlocks: 256}}}, nil)
	require.NoError(t, err)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		ts.Close()
	})
	ev := `[{"worker_id": 1, "event": {"event_id": 1, "data": {"stored": {"parent_hash": null, "blocks": [{"block_hash": 5, "tokens_hash": 6}]}}}}]`
	resp, err := http.Post(ts.URL+"/v1/pools/p/events?source_epoch=1", "application/json", strings.NewReader(ev))
	require.NoError(t, err, "post events: %v %v", err, resp.Status)
	require.Equal(t, http.StatusAccepted, resp.StatusCode, "post events: %v %v", err, resp.Status)
	resp.Body.Close()
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"tail", "--relay", ts.URL, "--pool", "p", "--frames", "1"}, &out, &errb)
	require.Equal(t, 0, code, "run tail = %d, stderr %q", code, errb.String())
	var m struct {
		Kind  string   `json:"kind"`
		Words []string `json:"words"`
	}
	{
		err := json.NewDecoder(bufio.NewReader(&out)).Decode(&m)
		require.NoError(t, err, "tail line %+v (%v), want a snapshot chunk with words", m, err)
		require.Equal(t, "snapshot_chunk", m.Kind, "tail line %+v (%v), want a snapshot chunk with words", m, err)
		require.NotEmpty(t, m.Words, "tail line %+v (%v), want a snapshot chunk with words", m, err)
	}
	// The default epoch is the clock, so running tail again (the same
	// consumer and lane) is not refused as a stale lease.
	errb.Reset()
	code = run(context.Background(), []string{"tail", "--relay", ts.URL, "--pool", "p", "--frames", "1"}, io.Discard, &errb)
	require.Equal(t, 0, code, "second run tail = %d, stderr %q", code, errb.String())
	// An unknown pool is the relay's 404, reported with exit 1.
	errb.Reset()
	code = run(context.Background(), []string{"tail", "--relay", ts.URL, "--pool", "nope"}, io.Discard, &errb)
	assert.False(t, code != 1 || !strings.Contains(errb.String(), "unknown_pool"), "tail unknown pool = %d, stderr %q; want 1 and unknown_pool", code, errb.String())
}

func TestRun_DemoPrintsSummary(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo for a second")
	}
	for _, kind := range []string{"native", "wasm"} {
		t.Run(kind, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(context.Background(), []string{"demo", "--duration", "1s", "--consumer", kind, "--rate", "500"}, &out, &errb)
			require.Equal(t, 0, code, "demo = %d, stderr %q", code, errb.String())
			s := out.String()
			for _, want := range []string{kind + " consumer", "summary after", "best-DC agreement", "false-positive rate", "lane 2 (dc-2)"} {
				assert.Contains(t, s, want, "demo output lacks %q:\n%s", want, s)
			}
		})
	}
}

func TestRun_DemoStopsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // cancelled before it starts: it must return, not hang
	var out bytes.Buffer
	code := run(ctx, []string{"demo", "--consumer", "native"}, &out, io.Discard)
	assert.False(t, code == 0 && !strings.Contains(out.String(), "summary"), "cancelled demo = %d with output %q", code, out.String())
}

// run tail against a relay serving TLS under a private CA: trusted through
// --ca-file, refused without it, and a file without a certificate is named.
func TestRun_TailPrivateCA(t *testing.T) {
	srv, err := server.New(server.Config{Pools: []server.PoolSpec{{Name: "p", DCID: 1, ExpectedBlocks: 256}}}, nil)
	require.NoError(t, err)
	ts := httptest.NewTLSServer(srv.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		ts.Close()
	})
	ca := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw}), 0o600))
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"tail", "--relay", ts.URL, "--pool", "p", "--frames", "1", "--ca-file", ca}, &out, &errb)
	require.Equal(t, 0, code, "stderr %q", errb.String())
	assert.Contains(t, out.String(), `"kind":"snapshot_chunk"`)

	errb.Reset()
	code = run(context.Background(), []string{"tail", "--relay", ts.URL, "--pool", "p", "--frames", "1"}, io.Discard, &errb)
	assert.Equal(t, 1, code)
	assert.Contains(t, errb.String(), "certificate")

	notPEM := filepath.Join(t.TempDir(), "x.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("not a certificate"), 0o600))
	errb.Reset()
	code = run(context.Background(), []string{"tail", "--relay", ts.URL, "--pool", "p", "--ca-file", notPEM}, io.Discard, &errb)
	assert.Equal(t, 1, code)
	assert.Contains(t, errb.String(), "no PEM certificate")
}

// relay demo exits 1 on a bad or missing trace, before starting the run.
func TestDemo_BadTraceExits1(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.jsonl")
	trace := `{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}` + "\n" + `{"timestamp": 1, "hash_ids": [oops]}` + "\n"
	require.NoError(t, os.WriteFile(path, []byte(trace), 0o644))
	for _, tc := range []struct{ path, want string }{
		{path, "trace line 2"},
		{filepath.Join(t.TempDir(), "missing.jsonl"), "no such file"},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), []string{"demo", "--consumer", "native", "--trace", tc.path}, &out, &errb)
		assert.Equal(t, 1, code, "demo --trace %s: stderr %q", tc.path, errb.String())
		assert.Contains(t, errb.String(), tc.want, "demo --trace %s", tc.path)
		assert.Empty(t, out.String(), "demo --trace %s started before failing", tc.path)
	}
}

// Two `relay tail` runs with default flags are two consumers: the second
// does not take the first one's lane (before, both were consumer 1, and
// the second superseded the first, which ended on a close frame).
func TestRun_TailsWithDefaultsAreDistinctConsumers(t *testing.T) {
	srv, err := server.New(server.Config{HeartbeatInterval: server.Duration(20 * time.Millisecond),
		Pools: []server.PoolSpec{{Name: "p", DCID: 1, ExpectedBlocks: 256}}}, nil)
	require.NoError(t, err)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		ts.Close()
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	first := &syncBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"tail", "--relay", ts.URL, "--pool", "p"}, first, io.Discard)
	}()
	require.Eventually(t, func() bool { return strings.Contains(first.String(), `"heartbeat"`) }, 10*time.Second, 5*time.Millisecond,
		"the first tail follows the pool")
	var out, errb bytes.Buffer
	require.Equal(t, 0, run(t.Context(), []string{"tail", "--relay", ts.URL, "--pool", "p", "--frames", "3"}, &out, &errb), "%s", errb.String())
	n := strings.Count(first.String(), "\n")
	require.Eventually(t, func() bool { return strings.Count(first.String(), "\n") > n+2 }, 10*time.Second, 5*time.Millisecond,
		"the first tail still receives heartbeats after the second ran")
	assert.NotContains(t, first.String(), `"close"`, "the first tail's stream was not superseded")
	select {
	case code := <-done:
		require.FailNow(t, "the first tail ended", "exit %d: %s", code, first.String())
	default:
	}
	cancel()
	<-done
}

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
