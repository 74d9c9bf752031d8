package wasmtime_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	wt "github.com/bytecodealliance/wasmtime-go/v39"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/internal/integration/conformance"
	"github.com/ckfrelay/ckfrelay/internal/integration/wasmtime"
	"github.com/ckfrelay/ckfrelay/wasm/abi"
	"github.com/ckfrelay/ckfrelay/wasm/host"
)

// root is the main module's root seen from this package.
const root = "../../.."

var dir = filepath.Join(root, conformance.Dir)

// cacheDir keeps Cranelift's compiled module between test runs, so only the
// first run pays the compile.
func cacheDir() string { return filepath.Join(os.TempDir(), "ckfrelay-wasmtime-cache") }

// perfMap is WASMTIME_PROFILING_STRATEGY_PERFMAP of wasmtime's C API
// (wasmtime/config.h: none, jitdump, vtune, perfmap), which wasmtime-go v39
// does not name.
const perfMap wt.ProfilingStrategy = 3

var (
	rtOnce sync.Once
	rt     *wasmtime.Runtime
	rtErr  error
)

// runtime is one engine and compiled module shared by every test and
// benchmark of the package.
func runtime(tb testing.TB) *wasmtime.Runtime {
	tb.Helper()
	rtOnce.Do(func() {
		// CKF_WASMTIME_PERFMAP=1 writes /tmp/perf-<pid>.map so that
		// `perf record`/`perf report` name the module's functions.
		if os.Getenv("CKF_WASMTIME_PERFMAP") != "" {
			cfg := wt.NewConfig()
			cfg.SetProfiler(perfMap)
			rt, rtErr = wasmtime.NewRuntimeWithConfig(cfg, host.EmbeddedModule(), "")
			return
		}
		rt, rtErr = wasmtime.NewRuntime(host.EmbeddedModule(), cacheDir())
	})
	require.NoError(tb, rtErr)
	return rt
}

func factory(tb testing.TB) conformance.Factory {
	r := runtime(tb)
	return func(m consumer.Manifest) (client.Lanes, error) { return r.NewInstance(m) }
}

func load(t *testing.T) []conformance.Scenario {
	t.Helper()
	ss, err := conformance.LoadDir(dir)
	require.NoError(t, err)
	require.NotEmpty(t, ss, "no scenarios in %s", dir)
	return ss
}

// TestScenarios runs every conformance scenario (the files the native,
// wazero and Node runners run) on wasmtime.
func TestScenarios(t *testing.T) {
	f := factory(t)
	for _, s := range load(t) {
		t.Run(s.Name, func(t *testing.T) {
			diffs, err := conformance.Run(&s, f)
			require.NoError(t, err)
			assert.Empty(t, diffs, "steps whose result differs from the file")
		})
	}
}

// TestScenarios_AlteredExpectationFails proves the runner can fail: in each
// scenario, one step's expected result is altered in memory, and the run must
// report exactly that step as a mismatch, and nothing else.
func TestScenarios_AlteredExpectationFails(t *testing.T) {
	f := factory(t)
	for _, s := range load(t) {
		t.Run(s.Name, func(t *testing.T) {
			for _, i := range []int{0, len(s.Steps) / 2, len(s.Steps) - 1} {
				alt := s
				alt.Steps = append([]conformance.Step(nil), s.Steps...)
				alt.Steps[i].Want.Code += 1000
				diffs, err := conformance.Run(&alt, f)
				require.NoError(t, err)
				require.Len(t, diffs, 1, "step %d altered", i)
				assert.True(t, strings.HasPrefix(diffs[0], fmt.Sprintf("%s step %d ", s.Name, i)), diffs[0])
			}
		})
	}
	// A query's depths, not only its code: alter the first query step
	// that found blocks.
	for _, s := range load(t) {
		for i, st := range s.Steps {
			if st.Op != conformance.OpQuery || len(st.Want.Depths) == 0 {
				continue
			}
			alt := s
			alt.Steps = append([]conformance.Step(nil), s.Steps...)
			d := append([]uint32(nil), st.Want.Depths...)
			d[0]++
			alt.Steps[i].Want.Depths = d
			diffs, err := conformance.Run(&alt, f)
			require.NoError(t, err)
			require.Len(t, diffs, 1)
			assert.Contains(t, diffs[0], fmt.Sprintf("%s step %d ", s.Name, i))
			return
		}
	}
	require.Fail(t, "no query step with depths in any scenario")
}

// TestInstance_Errors checks what the scenarios cannot: errors match the
// native sentinels, buffers do not leak, and a closed instance says so.
func TestInstance_Errors(t *testing.T) {
	ss := load(t)
	r := runtime(t)
	m := ss[0].Manifest
	man, err := abi.DecodeManifest(m)
	require.NoError(t, err)
	in, err := r.NewInstance(man)
	require.NoError(t, err)

	var res consumer.QueryResult
	err = in.QuerySequenceHashes([]uint64{1, 2, 3}, &res)
	require.ErrorIs(t, err, consumer.ErrUnavailable)
	assert.Equal(t, 3, res.Blocks)
	require.ErrorIs(t, in.QueryTokens(make([]uint32, 32), 0, 1337, &res), consumer.ErrInvalidQuery)
	_, err = in.LaneStatus(-1)
	require.ErrorIs(t, err, consumer.ErrWrongLane)
	assert.Contains(t, err.Error(), "lane -1")
	_, err = in.ApplyFrame([]byte{0x93, 0x02})
	require.Error(t, err)
	n, err := in.LiveBuffers()
	require.NoError(t, err)
	assert.Equal(t, 2, n, "scratch and record buffers only")

	bad := man
	bad.VerificationWindow = 99
	_, err = r.NewInstance(bad)
	require.ErrorIs(t, err, consumer.ErrInvalidManifest)

	require.NoError(t, in.Close())
	_, err = in.Stats()
	require.ErrorIs(t, err, wasmtime.ErrClosed)
}
