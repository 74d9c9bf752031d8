package client

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wasm/host"
	"github.com/ckfrelay/ckfrelay/wire"
)

// TestRouter_InstanceResetEndsEveryLostSession (issue #30 item 2): one
// lane's frame larger than the WebAssembly module's memory limit traps the
// instance, which resets with every lane unassigned. The other lane must not
// stay dark while reported Ready: Lane says not Ready at once (the consumer
// is asked), and its session ends with ErrLeaseLost and resubscribes
// without waiting for its relay to send anything.
func TestRouter_InstanceResetEndsEveryLostSession(t *testing.T) {
	ctx := context.Background()
	rt, err := host.NewRuntime(ctx, host.NewConfig().WithMemoryLimitPages(512)) // 32 MiB
	require.NoError(t, err)
	t.Cleanup(func() { rt.Close(ctx) })
	in, err := rt.NewInstance(ctx, twoLaneManifest())
	require.NoError(t, err)
	t.Cleanup(func() { in.Close() })

	url, sessions, _ := fakeRelay(t)
	r := startRouter(t, Config{Relays: []Relay{{Addrs: []string{url}}}, ConsumerInstance: testConsumer,
		Targets:    []Target{{Pool: "a", Lane: 0}, {Pool: "b", Lane: 1}},
		MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond, IdleTimeout: -1, MaxFrameBytes: 64 << 20}, in)
	a, b := twoLanes(t, sessions)
	snapA, snapB := snapshotOn(0, testID, a.epoch, 5, words(1)), snapshotOn(1, idB, b.epoch, 5, words(2))
	a.write(t, func(w *wire.Writer) error { return w.WriteSnapshot(&snapA) })
	b.write(t, func(w *wire.Writer) error { return w.WriteSnapshot(&snapB) })
	waitFor(t, func() bool { return r.Lane(0).Ready && r.Lane(1).Ready })

	// dc-b's relay sends a valid delta of ~40 MiB: the guest cannot hold it.
	images := make([]ckf.BucketImage, 40<<20/wire.ImageBytes)
	for i := range images {
		images[i] = ckf.BucketImage{Bucket: uint32(i) % uint32(testFormat.BucketCount), Word: uint64(i)}
	}
	huge := wire.Frame{Kind: wire.KindDelta, Delta: ckf.Delta{Identity: idB, Lease: laneLease(1, b.epoch), BaseSequence: 5, Sequence: 6, Images: images}}
	b.write(t, func(*wire.Writer) error { return wire.NewWriter(b.body, 64<<20).WriteFrame(&huge) })
	waitFor(t, func() bool { return in.Resets() == 1 })
	assert.False(t, r.Lane(0).Ready, "lane 0 after the reset: the consumer no longer holds it")

	// Both lanes resubscribe, lane 0 although its relay sent nothing.
	twoLanes(t, sessions)
	li := r.Lane(0)
	assert.Contains(t, li.LastError, ErrLeaseLost.Error(), "why lane 0's session ended")
	assert.Equal(t, uint64(1), li.Resubscribes)
}

// TestRouter_FrameIgnoredAsForeignOnItsOwnLaneEndsTheSession (issue #30
// item 2): when a frame under the session's own lease comes back
// IgnoredForeignLease, the consumer lost the lane (here another holder of
// the Lanes retired it); the session ends with ErrLeaseLost and
// resubscribes instead of following a lane nobody serves.
func TestRouter_FrameIgnoredAsForeignOnItsOwnLaneEndsTheSession(t *testing.T) {
	url, sessions, _ := fakeRelay(t)
	n := newNative(t)
	r := startRouter(t, Config{Relays: []Relay{{Addrs: []string{url}}}, ConsumerInstance: testConsumer, Targets: []Target{{Pool: "p", Lane: 0}},
		MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond, IdleTimeout: -1}, n)
	s := nextSession(t, sessions)
	snap := snapshotOn(0, testID, s.epoch, 5, words(1))
	s.write(t, func(w *wire.Writer) error { return w.WriteSnapshot(&snap) })
	waitFor(t, func() bool { return r.Lane(0).Ready })
	require.NoError(t, n.Retire(0))
	assert.False(t, r.Lane(0).Ready, "Ready asks the consumer")
	s.frame(t, wire.Frame{Kind: wire.KindHeartbeat, Heartbeat: wire.Heartbeat{Identity: testID, Lease: lease(s.epoch), LastSequence: 5}})
	nextSession(t, sessions)
	assert.Contains(t, r.Lane(0).LastError, ErrLeaseLost.Error())
}
