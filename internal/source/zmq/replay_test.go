package zmq

import (
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
		got, err := Replay(t.Context(), rep, 0, 500*time.Millisecond, 100)
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
		got, err := Replay(t.Context(), rep, 3, time.Second, 100)
		require.NoError(t, err)
		require.Len(t, got, 3)
		for i, m := range got {
			require.Equal(t, int64(3+i), m.Seq)
		}
		_, err = Replay(t.Context(), rep, 0, time.Second, 100)
		require.ErrorIs(t, err, ErrReplayOverrun, "seqs 0 and 1 left the 4-batch buffer")
		got, err = Replay(t.Context(), rep, 9, time.Second, 100)
		require.NoError(t, err)
		require.Empty(t, got, "nothing at or after 9 yet")
		_, err = Replay(t.Context(), rep, 2, time.Second, 2)
		require.ErrorIs(t, err, ErrReplay, "more than maxBatches")
	}
}
