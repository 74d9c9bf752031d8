package host_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wasm/host"
	"github.com/ckfrelay/ckfrelay/wire"
)

// TestInstance_InputCapMatchesNative: inputs just over consumer.MaxInputBytes
// (a frame body, and each query kind in its ABI encoding) get the native
// consumer's typed errors from the module too — wire.ErrFrameTooLarge for a
// frame, consumer.ErrInvalidQuery for a query — not an OutOfMemory that
// matches no consumer or wire sentinel; an input of exactly the cap is
// answered by both, with the same result; and the instance is not reset.
func TestInstance_InputCapMatchesNative(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates several 64 MiB inputs")
	}
	ctx := context.Background()
	rt, err := host.NewRuntime(ctx, host.NewConfig().WithCompilationCacheDir(cacheDir()))
	require.NoError(t, err)
	defer rt.Close(ctx)
	_, n, in := readyPair(t, rt, 2)

	over := make([]uint64, consumer.MaxInputBytes/8+1)
	frame := make([]byte, consumer.MaxInputBytes+1)
	tokens := make([]uint32, consumer.MaxInputBytes/4+1)
	mm := ckf.HashOptions{MM: [][]uint64{make([]uint64, consumer.MaxInputBytes/8)}}
	for _, c := range []struct {
		name string
		impl client.Lanes
	}{{"native", n}, {"wasm", in}} {
		r, err := c.impl.ApplyFrame(frame)
		assert.ErrorIs(t, err, wire.ErrFrameTooLarge, "%s: frame of MaxInputBytes+1", c.name)
		assert.Equal(t, -1, r.Lane, "%s: no lane", c.name)
		var res consumer.QueryResult
		assert.ErrorIs(t, c.impl.QuerySequenceHashes(over, &res), consumer.ErrInvalidQuery, "%s: sequence hashes", c.name)
		assert.ErrorIs(t, c.impl.Query(over, &res), consumer.ErrInvalidQuery, "%s: local hashes", c.name)
		assert.ErrorIs(t, c.impl.QueryTokens(tokens, 4, ckf.BaseSalt, &res), consumer.ErrInvalidQuery, "%s: tokens", c.name)
		assert.ErrorIs(t, c.impl.QueryTokensWith(tokens[:4], 4, ckf.BaseSalt, mm, &res), consumer.ErrInvalidQuery, "%s: token query with multimodal hashes", c.name)
		assert.Equal(t, consumer.QueryResult{}, res, "%s: a refused query writes no result", c.name)
	}
	var want, got consumer.QueryResult
	require.NoError(t, n.QuerySequenceHashes(over[:len(over)-1], &want), "native: exactly MaxInputBytes")
	require.NoError(t, in.QuerySequenceHashes(over[:len(over)-1], &got), "wasm: exactly MaxInputBytes")
	assert.Equal(t, want, got, "a query of exactly MaxInputBytes: native (want), wasm (got)")
	assert.Zero(t, in.Resets(), "no trap")
}
