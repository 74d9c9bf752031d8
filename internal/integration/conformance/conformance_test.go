package conformance_test

import (
	"context"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/internal/integration/conformance"
	"github.com/ckfrelay/ckfrelay/wasm/host"
)

var update = flag.Bool("update", false, "rewrite testdata/conformance from the generator")

// dir is the scenario directory seen from this package.
var dir = filepath.Join("..", "..", "..", conformance.Dir)

func TestScenarios_UpToDate(t *testing.T) {
	for _, s := range conformance.Generate() {
		b, err := conformance.Marshal(&s)
		require.NoError(t, err)
		path := filepath.Join(dir, s.Name+".json")
		if *update {
			require.NoError(t, os.WriteFile(path, b, 0o644))
			continue
		}
		have, err := os.ReadFile(path)
		require.NoError(t, err, "regenerate with `go test ./internal/integration/conformance -run TestScenarios_UpToDate -update`")
		assert.Equal(t, string(b), string(have), "%s is stale: the generator (expected) differs from the file on disk (actual); regenerate with `go test ./internal/integration/conformance -run TestScenarios_UpToDate -update`", path)
	}
}

func load(t *testing.T) []conformance.Scenario {
	t.Helper()
	ss, err := conformance.LoadDir(dir)
	require.NoError(t, err)
	require.NotEmpty(t, ss, "no scenarios in %s", dir)
	return ss
}

func runAll(t *testing.T, f conformance.Factory) {
	for _, s := range load(t) {
		t.Run(s.Name, func(t *testing.T) {
			diffs, err := conformance.Run(&s, f)
			require.NoError(t, err)
			for _, d := range diffs {
				assert.Fail(t, d)
			}
		})
	}
}

func TestNative(t *testing.T) {
	runAll(t, func(m consumer.Manifest) (client.Lanes, error) { return client.NewNative(m) })
}

func TestWazero(t *testing.T) {
	ctx := context.Background()
	rt, err := host.NewRuntime(ctx, host.NewConfig().WithCompilationCacheDir(cacheDir()))
	require.NoError(t, err)
	defer rt.Close(ctx)
	runAll(t, func(m consumer.Manifest) (client.Lanes, error) { return rt.NewInstance(ctx, m) })
}

// TestNode runs the same files through testdata/conformance/run.mjs under
// Node's WASI, a second host that shares no code with wasm/host.
func TestNode(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not installed: the Node.js conformance host is skipped (install Node ≥ 20 to run it)")
	}
	wasm := filepath.Join("..", "..", "..", "wasm", "host", "ckfconsumer.wasm")
	cmd := exec.Command(node, filepath.Join(dir, "run.mjs"), wasm, dir)
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	require.NoError(t, err, "node runner")
}

// cacheDir is a compilation cache shared by test runs, so only the first
// run pays the ≈ 1 s compile.
func cacheDir() string { return filepath.Join(os.TempDir(), "ckfrelay-wazero-cache") }

// TestWazeroPool runs the scenarios on a host.Pool of two instances: every
// frame reaches both, and results are the same as one consumer's.
func TestWazeroPool(t *testing.T) {
	ctx := context.Background()
	rt, err := host.NewRuntime(ctx, host.NewConfig().WithCompilationCacheDir(cacheDir()))
	require.NoError(t, err)
	defer rt.Close(ctx)
	runAll(t, func(m consumer.Manifest) (client.Lanes, error) { return rt.NewPool(ctx, m, 2) })
}
