package streamprobe_test

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/internal/integration/conformance"
	"github.com/ckfrelay/ckfrelay/internal/testing/streamprobe"
	"github.com/ckfrelay/ckfrelay/wire"
)

// TestReader_MeasuresWhenAProbedBlockArrives feeds a real producer's
// snapshot and deltas through a pipe: the reader is ready after the
// snapshot, times a probed block from its t0 to the delta that carries it,
// keeps one probe pending at a time, and returns the stream's end.
func TestReader_MeasuresWhenAProbedBlockArrives(t *testing.T) {
	fx, err := conformance.NewFixture(1<<10, 1)
	require.NoError(t, err)
	c, err := consumer.New(fx.Manifest)
	require.NoError(t, err)
	p := streamprobe.New(c)

	pr, pw := io.Pipe()
	w := wire.NewWriter(pw, 0)
	done := make(chan error, 1)
	go func() { done <- p.Run(pr) }()
	snap, err := fx.Subscribe(0, fx.Lease(0, 1), 0)
	require.NoError(t, err)
	for _, b := range snap {
		require.NoError(t, w.WriteRaw(b))
	}
	<-p.Ready()

	keys := fx.Store(0, []uint32{1, 2, 3, 4, 5, 6, 7, 8}, 4)
	assert.False(t, p.Visible(keys[0]), "not before its delta")
	t0 := time.Now()
	require.True(t, p.Probe(keys[0], t0))
	assert.False(t, p.Probe(keys[1], t0), "one probe pending at a time")
	assert.False(t, p.Idle())
	time.Sleep(2 * time.Millisecond) // the measured time includes this
	_, deltas := fx.Deltas(0)
	require.NotEmpty(t, deltas)
	for _, b := range deltas {
		require.NoError(t, w.WriteRaw(b))
	}
	require.Eventually(t, func() bool { return p.Measured() == 1 }, 10*time.Second, time.Millisecond)
	assert.True(t, p.Visible(keys[0]))
	assert.True(t, p.Idle())
	s, p50, p99 := p.Freshness()
	require.Len(t, s, 1)
	assert.GreaterOrEqual(t, p50, 2*time.Millisecond)
	assert.Equal(t, p50, p99)
	assert.True(t, p.Probe(keys[1], time.Now()), "the next probe is taken once the first is measured")

	require.NoError(t, pw.Close())
	assert.ErrorIs(t, <-done, io.EOF)
}
