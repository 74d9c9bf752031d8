package conformance_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/ckfrelay/ckfrelay/internal/integration/conformance"
	"github.com/ckfrelay/ckfrelay/wasm/abi"
	"github.com/ckfrelay/ckfrelay/wasm/host"
)

// rawModule instantiates the embedded module with wazero and no wasm/host
// wrapper, so a test can pass the module exactly what a host in another
// language would (a negative i32 lane, a bogus pointer), without the Go
// host's own argument checks in between.
func rawModule(t *testing.T) api.Module {
	t.Helper()
	ctx := context.Background()
	cache, err := wazero.NewCompilationCacheWithDir(cacheDir())
	require.NoError(t, err)
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig().WithCompilationCache(cache))
	t.Cleanup(func() { _ = rt.Close(ctx); _ = cache.Close(ctx) })
	wasi_snapshot_preview1.MustInstantiate(ctx, rt)
	mod, err := rt.InstantiateWithConfig(ctx, host.EmbeddedModule(),
		wazero.NewModuleConfig().WithName("").WithStartFunctions("_initialize"))
	require.NoError(t, err)
	return mod
}

func call(t *testing.T, mod api.Module, name string, args ...uint64) int32 {
	t.Helper()
	r, err := mod.ExportedFunction(name).Call(context.Background(), args...)
	require.NoError(t, err, name)
	return int32(r[0])
}

// lastError reads the module's last_error message through a buffer at out.
func lastError(t *testing.T, mod api.Module, out uint32) string {
	t.Helper()
	n := call(t, mod, "last_error", uint64(out), 256)
	b, ok := mod.Memory().Read(out, uint32(min(n, 256)))
	require.True(t, ok)
	return string(b)
}

// TestModule_SignedArgumentsAndErrorTexts pins three ABI defects a host in
// another language found: lane_status(-1) named lane 65536, a failed free
// left last_error at the previous message, and a negative token block size
// answered a mask where the native consumer says ErrInvalidQuery.
func TestModule_SignedArgumentsAndErrorTexts(t *testing.T) {
	mod := rawModule(t)
	scenarios, err := conformance.LoadDir(dir)
	require.NoError(t, err)
	manifest := scenarios[0].Manifest
	m, err := abi.DecodeManifest(manifest)
	require.NoError(t, err)
	words := 8 * m.Format.BucketCount
	in := uint32(call(t, mod, "alloc", max(uint64(len(manifest)), words)))
	out := uint32(call(t, mod, "alloc", 256))
	require.NotZero(t, in)
	require.True(t, mod.Memory().Write(in, manifest))
	require.Equal(t, int32(abi.OK), call(t, mod, "configure", uint64(in), uint64(len(manifest))))

	minus1 := uint64(uint32(0xffffffff)) // i32 -1 as the engine passes it
	assert.Equal(t, int32(abi.ErrWrongLane), call(t, mod, "lane_status", minus1, uint64(out)))
	assert.Contains(t, lastError(t, mod, out), "lane -1")
	assert.Equal(t, int32(abi.ErrWrongLane), call(t, mod, "lane_words", minus1, uint64(in), words))
	assert.Contains(t, lastError(t, mod, out), "lane -1")
	assert.Equal(t, int32(abi.ErrWrongLane), call(t, mod, "retire", minus1))
	assert.Contains(t, lastError(t, mod, out), "lane -1")

	assert.Equal(t, int32(abi.ErrBadArgument), call(t, mod, "free", uint64(in+1)))
	assert.Contains(t, lastError(t, mod, out), "free")

	// Eight tokens with block size -1: natively ErrInvalidQuery.
	assert.Equal(t, int32(abi.ErrInvalidQuery), call(t, mod, "query", abi.QueryTokens, uint64(in), 8, minus1, 1337, uint64(out)))
	assert.Equal(t, int32(abi.ErrInvalidQuery), call(t, mod, "query", abi.QueryTokens, uint64(in), 8, 0, 1337, uint64(out)))
}
