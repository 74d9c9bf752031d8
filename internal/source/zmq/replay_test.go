package zmq

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/source/zmq/zmqtest"
)

// A replay socket serves client after client (each DEALER closes after its end
// marker); the emulator once stopped serving after a client left.
func TestReplay_ManyClientsInARow(t *testing.T) {
	pub, rep := endpoint(t, 1)
	e := startEngine(t, zmqtest.Config{Endpoint: pub, Replay: rep})
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
