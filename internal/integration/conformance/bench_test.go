package conformance_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wasm/abi"
	"github.com/ckfrelay/ckfrelay/wasm/host"
	"github.com/ckfrelay/ckfrelay/wire"
)

// The same query in two hosts of the one module, side by side in one run:
// wazero (wasm/host) and Node (js/, through js/bench/query.mjs). 16 lanes of
// 524,288 buckets, each holding a 50%-loaded filter and one 1024-block
// request of 16-token blocks, queried by tokens (hashing in the module), as
// wasm/host's BenchmarkQuery does.
const (
	nodeBenchBuckets   = 524288
	nodeBenchBlockSize = 16
	nodeBenchDepth     = 1024
)

type nodeBenchState struct {
	manifest consumer.Manifest
	assign   [ckf.MaxLanes][]byte
	frames   [ckf.MaxLanes][]byte
	ids      [ckf.MaxLanes]ckf.ProducerIdentity
	leases   [ckf.MaxLanes]ckf.LaneLease
	tokens   []uint32
}

func newNodeBenchState(b *testing.B) *nodeBenchState {
	f, err := ckf.NewFilter(nodeBenchBuckets, ckf.DefaultSeed, ckf.DefaultMaxKicks)
	require.NoError(b, err)
	rng := rand.New(rand.NewPCG(1, 2))
	s := &nodeBenchState{tokens: make([]uint32, nodeBenchDepth*nodeBenchBlockSize)}
	for i := range s.tokens {
		s.tokens[i] = rng.Uint32()
	}
	locals := ckf.AppendLocalBlockHashes(nil, s.tokens, nodeBenchBlockSize, ckf.BaseSalt)
	for _, h := range ckf.AppendSequenceHashes(nil, locals) {
		require.NoError(b, f.Insert(h))
	}
	for f.LoadFactor() < 0.5 {
		_ = f.Insert(rng.Uint64())
	}
	words := f.Words()
	d := ckf.Domain{CacheSemantics: ckf.ScopedDigest{Digest: [16]byte{7}}}
	s.manifest = consumer.Manifest{ConsumerInstance: 1, Domain: d, Format: ckf.NewFormat(ckf.DefaultSeed, nodeBenchBuckets),
		VerificationWindow: consumer.DefaultVerificationWindow}
	for l := range ckf.MaxLanes {
		p := ckf.PoolID{Domain: d, DCID: uint64(l)}
		s.manifest.Lanes[l] = &p
		s.ids[l] = ckf.ProducerIdentity{Pool: p, ProducerIncarnation: 1, LayoutGeneration: 1, Format: s.manifest.Format}
		s.leases[l] = ckf.LaneLease{ConsumerInstance: 1, PhysicalLane: uint8(l), AssignmentEpoch: 1}
		s.assign[l] = abi.AppendAssignment(nil, &s.ids[l], &s.leases[l])
		s.frames[l], err = wire.AppendFrame(nil, &wire.Frame{Kind: wire.KindSnapshotChunk, Snapshot: wire.SnapshotChunk{
			Identity: s.ids[l], Lease: s.leases[l], Sequence: 1, ChunkCount: 1, Words: words}})
		require.NoError(b, err)
	}
	return s
}

// setupFile writes the state for js/bench/query.mjs.
func (s *nodeBenchState) setupFile(b *testing.B) string {
	var out []byte
	rec := func(p []byte) { out = append(binary.BigEndian.AppendUint32(out, uint32(len(p))), p...) }
	rec(abi.AppendManifest(nil, &s.manifest))
	for l := range ckf.MaxLanes {
		rec(s.assign[l])
		rec(s.frames[l])
	}
	t := make([]byte, 0, 4*len(s.tokens))
	for _, x := range s.tokens {
		t = binary.LittleEndian.AppendUint32(t, x)
	}
	rec(t)
	rec(binary.LittleEndian.AppendUint32(nil, nodeBenchBlockSize))
	path := filepath.Join(b.TempDir(), "setup.bin")
	require.NoError(b, os.WriteFile(path, out, 0o600))
	return path
}

func BenchmarkNodeQuery(b *testing.B) {
	node, err := exec.LookPath("node")
	if err != nil {
		b.Skip("node not installed: the Node.js query benchmark is skipped (install nodejs ≥ 20)")
	}
	s := newNodeBenchState(b)

	ctx := context.Background()
	rt, err := host.NewRuntime(ctx, host.NewConfig().WithCompilationCacheDir(cacheDir()))
	require.NoError(b, err)
	defer rt.Close(ctx)
	in, err := rt.NewInstance(ctx, s.manifest)
	require.NoError(b, err)
	for l := range ckf.MaxLanes {
		require.NoError(b, in.Assign(s.ids[l], s.leases[l]))
		r, err := in.ApplyFrame(s.frames[l])
		require.NoError(b, err)
		require.Equal(b, consumer.SnapshotInstalled, r.Outcome)
	}
	// One Node process for every run of the sub-benchmark: it installs the
	// same state from a file, then answers "N" requests.
	setup := s.setupFile(b)
	cmd := exec.Command(node, "--no-warnings", filepath.Join("..", "..", "..", "js", "bench", "query.mjs"),
		filepath.Join("..", "..", "..", "wasm", "host", "ckfconsumer.wasm"), setup)
	stdin, err := cmd.StdinPipe()
	require.NoError(b, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(b, err)
	cmd.Stderr = os.Stderr
	require.NoError(b, cmd.Start())
	defer func() { stdin.Close(); _ = cmd.Wait() }()
	sc := bufio.NewScanner(stdout)
	require.True(b, sc.Scan() && sc.Text() == "ready", "node driver did not start: %q", sc.Text())

	b.Run("impl=wazero", func(b *testing.B) {
		var res consumer.QueryResult
		lat := make([]time.Duration, 0, 1<<16)
		for b.Loop() {
			t0 := time.Now()
			if err := in.QueryTokens(s.tokens, nodeBenchBlockSize, ckf.BaseSalt, &res); err != nil {
				require.Fail(b, fmt.Sprint(err))
			}
			if len(lat) < cap(lat) {
				lat = append(lat, time.Since(t0))
			}
		}
		require.Equal(b, uint32(nodeBenchDepth), res.Depths[15])
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
		b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
	})

	b.Run("impl=node", func(b *testing.B) {
		b.ResetTimer()
		// One request of b.N queries; node times each one.
		_, err = fmt.Fprintf(stdin, "%d\n", b.N)
		require.NoError(b, err)
		require.True(b, sc.Scan(), "node driver ended")
		b.StopTimer()
		var p50, p99 float64
		var depth int
		_, err = fmt.Sscanf(sc.Text(), "ok %g %g %d", &p50, &p99, &depth)
		require.NoError(b, err, sc.Text())
		require.Equal(b, nodeBenchDepth, depth)
		b.ReportMetric(p50, "p50-ns")
		b.ReportMetric(p99, "p99-ns")
	})
}
