package producer

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
)

func imageActor(t *testing.T, start func(ckf.Config, Config) (Handle, <-chan Fault, error)) Handle {
	t.Helper()
	cfg := ckf.DefaultConfig()
	cfg.ExpectedBlocks = 64
	cfg.PublishEveryNEvents = 1
	pcfg := DefaultConfig()
	pcfg.MaxIdleSourceEpochs = 2
	h, faults, err := start(cfg, pcfg)
	require.NoError(t, err)
	go func() {
		for range faults {
		}
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = h.Shutdown(ctx)
	})
	return h
}

// TestStartImage_ContinuesWithTheIdleOrder: an actor started from another's
// image has its words, counters, epochs, idle order and sequence; the next
// member to go idle prunes the record the original would prune (the least
// recently idle one), so a later event of that member is judged as the
// original judges it.
func TestStartImage_ContinuesWithTheIdleOrder(t *testing.T) {
	ctx := t.Context()
	a, b, c, d := ckf.Member{WorkerID: 1}, ckf.Member{WorkerID: 2}, ckf.Member{WorkerID: 3}, ckf.Member{WorkerID: 4}
	orig := imageActor(t, func(cfg ckf.Config, pcfg Config) (Handle, <-chan Fault, error) {
		p, err := ckf.NewPool(cfg)
		require.NoError(t, err)
		return Start(p, testScope(), pcfg)
	})
	// b goes idle before a (the idle order is not the member order), d
	// holds blocks.
	require.NoError(t, orig.AdmitEvents(ctx, 5, []ckf.RouterEvent{stored(b, 1, 20)}))
	require.NoError(t, orig.AdmitEvents(ctx, 7, []ckf.RouterEvent{stored(a, 2, 10)}))
	require.NoError(t, orig.AdmitEvents(ctx, 1, []ckf.RouterEvent{stored(d, 3, 40, 41)}))
	require.NoError(t, orig.AdmitEvents(ctx, 5, []ckf.RouterEvent{removed(b, 4, 20)}))
	require.NoError(t, orig.AdmitEvents(ctx, 7, []ckf.RouterEvent{removed(a, 5, 10)}))
	img, err := orig.ExportImage(ctx)
	require.NoError(t, err)
	require.Equal(t, []EpochImage{{Member: d, Epoch: 1}, {Member: b, Epoch: 5, Idle: true}, {Member: a, Epoch: 7, Idle: true}}, img.Epochs)

	restored := imageActor(t, func(cfg ckf.Config, pcfg Config) (Handle, <-chan Fault, error) {
		return StartImage(cfg, &img, testScope(), pcfg)
	})
	again, err := restored.ExportImage(ctx)
	require.NoError(t, err)
	require.Equal(t, img, again)

	// c goes idle: b, the least recently idle, is pruned on both; a stale
	// event of a is still dropped, one of b (unknown again) sets its epoch.
	for _, h := range []Handle{orig, restored} {
		require.NoError(t, h.AdmitEvents(ctx, 3, []ckf.RouterEvent{stored(c, 6, 30)}))
		require.NoError(t, h.AdmitEvents(ctx, 3, []ckf.RouterEvent{removed(c, 7, 30)}))
		require.NoError(t, h.AdmitEvents(ctx, 6, []ckf.RouterEvent{stored(a, 8, 11)}))
		require.NoError(t, h.AdmitEvents(ctx, 2, []ckf.RouterEvent{stored(b, 9, 21)}))
	}
	want, err := orig.ExportImage(ctx)
	require.NoError(t, err)
	got, err := restored.ExportImage(ctx)
	require.NoError(t, err)
	require.Equal(t, want, got)
	require.Equal(t, []EpochImage{{Member: b, Epoch: 2}, {Member: d, Epoch: 1}, {Member: a, Epoch: 7, Idle: true}, {Member: c, Epoch: 3, Idle: true}}, got.Epochs)
	require.Equal(t, uint64(1), got.EpochsPruned)
}

// TestStartImage_RefusesDuplicateRecords: a damaged image is refused before
// an actor starts.
func TestStartImage_RefusesDuplicateRecords(t *testing.T) {
	cfg := ckf.DefaultConfig()
	cfg.ExpectedBlocks = 64
	p, err := ckf.NewPool(cfg)
	require.NoError(t, err)
	img := Image{Pool: p.Image(), Epochs: []EpochImage{{Member: worker1, Epoch: 1}, {Member: worker1, Epoch: 2, Idle: true}}}
	_, _, err = StartImage(cfg, &img, testScope(), DefaultConfig())
	require.ErrorIs(t, err, ckf.ErrInvalidImage)
	img.Epochs = []EpochImage{{Member: worker1, Epoch: MaxSourceEpoch + 1}}
	_, _, err = StartImage(cfg, &img, testScope(), DefaultConfig())
	require.ErrorIs(t, err, ckf.ErrInvalidImage)
}
