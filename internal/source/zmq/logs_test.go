package zmq

import (
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/sim/engine"
)

// countingHandler counts log records by message.
type countingHandler struct {
	mu sync.Mutex
	n  map[string]int
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.n[r.Message]++
	h.mu.Unlock()
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

func (h *countingHandler) count(msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[msg]
}

// TestSource_GapFloodIsLoggedRateLimited: an engine that loses a message
// before every one it sends (no replay: each gap resets the rank degraded)
// makes 200 gaps and 200 degraded resets, each counted exactly, but only a
// few log lines — one per kind per second, not one per message.
func TestSource_GapFloodIsLoggedRateLimited(t *testing.T) {
	pub, _ := endpoint(t, 1)
	e := startEngine(t, engine.Config{Endpoint: pub})
	logs := &countingHandler{n: map[string]int{}}
	hs := newHarness(t, Config{Endpoint: pub, Worker: 1, Logger: slog.New(logs)})
	hs.publishUntilSeen(e, 0)
	base := hs.src.Status()
	const gaps = 200
	for range gaps {
		e.DropNext(1)
		require.NoError(t, e.Heartbeat()) // lost
		require.NoError(t, e.Heartbeat()) // heard: a gap
	}
	hs.publishUntilSeen(e, 0)
	st := hs.src.Status()
	assert.EqualValues(t, gaps, st.Gaps-base.Gaps, "every gap counted")
	assert.EqualValues(t, gaps, st.Degraded-base.Degraded, "every degraded reset counted")
	assert.LessOrEqual(t, logs.count("zmq source: sequence gap"), 5)
	assert.LessOrEqual(t, logs.count("zmq source: rank reset (degraded)"), 5)
	assert.Positive(t, logs.count("zmq source: sequence gap"), "the first is logged")
}
