package natspub

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/hub"
	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
	"github.com/ckfrelay/ckfrelay/wire"
)

// A publisher whose replica stops leading (Config.Leading says false: a
// leader resumed past its lease) publishes nothing more — no heartbeat, no
// end frame — and Run returns ErrNotLeading, while its hub is still open.
func TestPublisherStopsWhenItsReplicaNoLongerLeads(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	_, js := ns.JetStream(t)
	h, err := hub.New(hub.DefaultConfig())
	require.NoError(t, err)
	h.Install(ckf.Snapshot{Identity: ckf.ProducerIdentity{ProducerIncarnation: 7, LayoutGeneration: 1, Format: ckf.NewFormat(1, 64)},
		Words: make([]uint64, 64)})
	var leading atomic.Bool
	leading.Store(true)
	p, err := New(js, h, Config{Pool: "p", Heartbeat: 10 * time.Millisecond, SnapshotInterval: time.Hour, MemoryStorage: true,
		Leading: leading.Load})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background()) }()
	require.Eventually(t, func() bool { return p.Stats().Heartbeats >= 3 }, 10*time.Second, time.Millisecond)

	leading.Store(false)
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrNotLeading)
	case <-time.After(10 * time.Second):
		require.Fail(t, "the publisher went on after its replica stopped leading")
	}
	// What it published is final: heartbeats only, no drain marker or
	// close frame, though the hub is still open.
	seqs, frames := storedFrames(t, js, p.Layout())
	for i, f := range frames {
		assert.Equal(t, wire.KindHeartbeat, f.Kind, "frame %d", seqs[i])
	}
	assert.Equal(t, p.Stats().Heartbeats, uint64(len(frames)))
}
