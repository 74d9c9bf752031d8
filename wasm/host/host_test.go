package host_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/internal/wasmbuild"
	"github.com/ckfrelay/ckfrelay/wasm/host"
)

// Instance and Pool are the module behind the project's one consumer
// interface.
var (
	_ client.Lanes = (*host.Instance)(nil)
	_ client.Lanes = (*host.Pool)(nil)
)

// root is the module root seen from this package.
const root = "../.."

func cacheDir() string { return filepath.Join(os.TempDir(), "ckfrelay-wazero-cache") }

func newRuntime(t testing.TB, cfg host.Config) *host.Runtime {
	t.Helper()
	ctx := context.Background()
	rt, err := host.NewRuntime(ctx, cfg.WithCompilationCacheDir(cacheDir()))
	require.NoError(t, err)
	t.Cleanup(func() { rt.Close(ctx) })
	return rt
}

// TestEmbeddedModule_UpToDate fails when wasm/host/ckfconsumer.wasm is not
// what `go run ./cmd/wasmbuild` builds from this tree, so CI catches a
// consumer, wire or guest change committed without rebuilding the module.
func TestEmbeddedModule_UpToDate(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the guest (≈ 10 s); runs without -short")
	}
	stamp, err := os.ReadFile(filepath.Join(root, wasmbuild.StampPath))
	require.NoError(t, err)
	if tc, _, _ := strings.Cut(string(stamp), " "); tc != runtime.Version() {
		msg := fmt.Sprintf("module was built with %s, this toolchain is %s: byte-for-byte comparison needs the same Go", tc, runtime.Version())
		if os.Getenv("CI") != "" {
			require.Fail(t, msg+" (CI must build with the toolchain the module was committed with)")
		}
		t.Skip(msg)
	}
	_, err = wasmbuild.Check(root)
	require.NoError(t, err)
}

func testManifest(lanes ...int) consumer.Manifest {
	d := ckf.Domain{CacheSemantics: ckf.ScopedDigest{Digest: [16]byte{1}}, RoutingScope: ckf.ScopedDigest{Digest: [16]byte{2}}}
	m := consumer.Manifest{ConsumerInstance: 1, Domain: d, Format: ckf.NewFormat(ckf.DefaultSeed, 64), VerificationWindow: 2}
	for _, l := range lanes {
		m.Lanes[l] = &ckf.PoolID{Domain: d, DCID: uint64(l)}
	}
	return m
}

func TestRuntime_NewInstanceErrorsMatchNative(t *testing.T) {
	rt := newRuntime(t, host.NewConfig())
	ctx := context.Background()
	bad := testManifest() // no lane
	_, nerr := client.NewNative(bad)
	_, werr := rt.NewInstance(ctx, bad)
	for _, err := range []error{nerr, werr} {
		assert.ErrorIs(t, err, consumer.ErrInvalidManifest)
	}
	var he *host.Error
	require.ErrorAs(t, werr, &he)
}

func TestNewRuntime_RejectsBadConfig(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		cfg  host.Config
		want error
	}{
		{"zero pages", host.NewConfig().WithMemoryLimitPages(0), host.ErrInvalidConfig},
		{"pages above 4 GiB", host.NewConfig().WithMemoryLimitPages(65537), host.ErrInvalidConfig},
		{"empty module", host.NewConfig().WithModule(nil), host.ErrInvalidConfig},
		{"not wasm", host.NewConfig().WithModule([]byte("\x00asm garbage")), host.ErrModule},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt, err := host.NewRuntime(ctx, tc.cfg)
			if err == nil {
				rt.Close(ctx)
			}
			assert.ErrorIs(t, err, tc.want)
		})
	}
}
