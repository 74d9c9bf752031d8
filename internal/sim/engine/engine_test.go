package engine

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"
)

// A restart while the replay server holds a request must not deadlock: the
// server reads the buffer under the engine's lock, so Restart must not hold
// it while it waits for the server to stop. Pause points order the two: the
// server has the request, Restart reaches its wait, then the server goes on.
func TestEngine_RestartDuringReplay(t *testing.T) {
	base, err := FreePorts(2)
	require.NoError(t, err)
	rep := fmt.Sprintf("tcp://127.0.0.1:%d", base+1)
	e, err := Start(Config{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base), Replay: rep})
	require.NoError(t, err)
	defer e.Close()
	require.NoError(t, e.Heartbeat())

	received, proceed := make(chan struct{}), make(chan struct{})
	replayReceived = func() { close(received); <-proceed }
	replayStopping = func() { close(proceed) }
	defer func() { replayReceived, replayStopping = nil, nil }()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d := zmq4.NewDealer(ctx, zmq4.WithLogger(quiet))
	defer d.Close()
	require.NoError(t, d.Dial(rep))
	require.NoError(t, d.SendMulti(zmq4.NewMsgFrom([]byte{}, binary.BigEndian.AppendUint64(nil, 0))))
	<-received
	replayReceived = nil // the restarted engine's server runs free
	done := make(chan error, 1)
	go func() { done <- e.Restart() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		require.Fail(t, "Restart deadlocked against the replay server")
	}
}
