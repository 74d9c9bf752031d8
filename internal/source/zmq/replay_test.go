package zmq

import (
	"math"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/sim/engine"
)

// A replay socket serves client after client (each DEALER closes after its end
// marker); the emulator once stopped serving after a client left.
func TestReplay_ManyClientsInARow(t *testing.T) {
	pub, rep := endpoint(t, 1)
	e := startEngine(t, engine.Config{Endpoint: pub, Replay: rep})
	for range 5 {
		require.NoError(t, e.Heartbeat())
	}
	fails := 0
	for i := range 100 {
		start := time.Now()
		got, err := Replay(t.Context(), rep, 0, math.MaxInt64, ReplayLimits{Timeout: 500 * time.Millisecond, MaxBatches: 100})
		if err != nil {
			fails++
			t.Logf("%d: %v after %v", i, err, time.Since(start))
			continue
		}
		require.Len(t, got, 5)
	}
	require.Zero(t, fails)
}

func TestReplay_OverrunAndLayouts(t *testing.T) {
	for _, layout := range []engine.Layout{engine.SeqPayload, engine.TopicSeqPayload} {
		pub, rep := endpoint(t, 1)
		e := startEngine(t, engine.Config{Endpoint: pub, Replay: rep, BufferSteps: 4, Layout: layout, Topic: "kv"})
		for range 6 {
			require.NoError(t, e.Heartbeat())
		}
		got, err := Replay(t.Context(), rep, 3, math.MaxInt64, ReplayLimits{Timeout: time.Second, MaxBatches: 100})
		require.NoError(t, err)
		require.Len(t, got, 3)
		for i, m := range got {
			require.Equal(t, int64(3+i), m.Seq)
		}
		_, err = Replay(t.Context(), rep, 0, math.MaxInt64, ReplayLimits{Timeout: time.Second, MaxBatches: 100})
		require.ErrorIs(t, err, ErrReplayOverrun, "seqs 0 and 1 left the 4-batch buffer")
		got, err = Replay(t.Context(), rep, 9, math.MaxInt64, ReplayLimits{Timeout: time.Second, MaxBatches: 100})
		require.NoError(t, err)
		require.Empty(t, got, "nothing at or after 9 yet")
		_, err = Replay(t.Context(), rep, 2, math.MaxInt64, ReplayLimits{Timeout: time.Second, MaxBatches: 2})
		require.ErrorIs(t, err, ErrReplay, "more than maxBatches")
	}
}

// A replay endpoint that accepts TCP and never speaks ZMTP costs one replay
// timeout, not the peer's patience: the timeout covers the handshake.
func TestReplay_SilentPeerCostsOneTimeout(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			accepted <- c
		}
	}()
	done := make(chan error, 1)
	go func() {
		_, err := Replay(t.Context(), "tcp://"+l.Addr().String(), 0, math.MaxInt64, ReplayLimits{Timeout: 300 * time.Millisecond, MaxBatches: 10})
		done <- err
	}()
	held = append(held, <-accepted)
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrReplay)
	case <-time.After(10 * time.Second):
		require.Fail(t, "Replay still waits for a peer that never greets")
	}
}
