package wasmtime_test

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
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wasm/abi"
	"github.com/ckfrelay/ckfrelay/wasm/host"
	"github.com/ckfrelay/ckfrelay/wire"
)

// BenchmarkRuntimes runs the consumer on four runtimes side by side in one
// run: native Go (client.Native), the module under wazero (wasm/host), under
// wasmtime (this package) and under Node (js/, through
// js/bench/runtimes.mjs). The state is wasm/host BenchmarkQuery's: 16 lanes
// of 524,288 buckets, each holding the same 50%-loaded filter and one
// 1024-block request of 16-token blocks, so a query of depth D finds D
// blocks on all 16 lanes.
//
// Every operation is timed alone (p50-ns, p99-ns): queries by tokens and by
// sequence hashes at depths 32, 128 and 1024; contains (one probe of 16
// lanes: mostly the cost of one call into the module); install of a whole 4 MiB
// snapshot on lane 0 under a new epoch (MB/s from the p50); and
// instantiate+configure of a fresh 16-lane consumer from an already compiled
// module (p50-ms).
const (
	benchBuckets   = 524288
	benchBlockSize = 16
	benchDepth     = 1024
)

type benchState struct {
	manifest consumer.Manifest
	ids      [ckf.MaxLanes]ckf.ProducerIdentity
	words    []uint64
	tokens   []uint32
	seq      []uint64
}

func newBenchState(b *testing.B) *benchState {
	f, err := ckf.NewFilter(benchBuckets, ckf.DefaultSeed, ckf.DefaultMaxKicks)
	require.NoError(b, err)
	rng := rand.New(rand.NewPCG(1, 2))
	s := &benchState{tokens: make([]uint32, benchDepth*benchBlockSize)}
	for i := range s.tokens {
		s.tokens[i] = rng.Uint32()
	}
	s.seq = ckf.AppendSequenceHashes(nil, ckf.AppendLocalBlockHashes(nil, s.tokens, benchBlockSize, ckf.BaseSalt))
	for _, h := range s.seq {
		require.NoError(b, f.Insert(h))
	}
	for f.LoadFactor() < 0.5 {
		_ = f.Insert(rng.Uint64())
	}
	s.words = f.Words()
	d := ckf.Domain{CacheSemantics: ckf.ScopedDigest{Digest: [16]byte{7}}}
	s.manifest = consumer.Manifest{ConsumerInstance: 1, Domain: d, Format: ckf.NewFormat(ckf.DefaultSeed, benchBuckets),
		VerificationWindow: consumer.DefaultVerificationWindow}
	for l := range ckf.MaxLanes {
		p := ckf.PoolID{Domain: d, DCID: uint64(l)}
		s.manifest.Lanes[l] = &p
		s.ids[l] = ckf.ProducerIdentity{Pool: p, ProducerIncarnation: 1, LayoutGeneration: 1, Format: s.manifest.Format}
	}
	return s
}

func lease(l int, epoch uint64) ckf.LaneLease {
	return ckf.LaneLease{ConsumerInstance: 1, PhysicalLane: uint8(l), AssignmentEpoch: epoch}
}

func (s *benchState) assignment(l int, epoch uint64) []byte {
	ls := lease(l, epoch)
	return abi.AppendAssignment(nil, &s.ids[l], &ls)
}

func (s *benchState) snapshot(b *testing.B, l int, epoch uint64) []byte {
	out, err := wire.AppendFrame(nil, &wire.Frame{Kind: wire.KindSnapshotChunk, Snapshot: wire.SnapshotChunk{
		Identity: s.ids[l], Lease: lease(l, epoch), Sequence: 1, ChunkCount: 1, Words: s.words}})
	require.NoError(b, err)
	return out
}

// install makes lanes 0..n-1 of c ready at epoch 1.
func (s *benchState) install(b *testing.B, c client.Lanes, n int) {
	for l := range n {
		require.NoError(b, c.Assign(s.ids[l], lease(l, 1)))
		r, err := c.ApplyFrame(s.snapshot(b, l, 1))
		require.NoError(b, err)
		require.Equal(b, consumer.SnapshotInstalled, r.Outcome)
	}
}

// epochByte returns the one offset where a's epoch-1 and epoch-2 encodings
// differ, holding 1 (a msgpack fixint, writable in place up to 127).
func epochByte(b *testing.B, e1, e2 []byte) uint32 {
	require.Equal(b, len(e1), len(e2))
	at := -1
	for i := range e1 {
		if e1[i] != e2[i] {
			require.Equal(b, -1, at, "encodings differ in more than one byte")
			at = i
		}
	}
	require.True(b, at >= 0 && e1[at] == 1 && e2[at] == 2)
	return uint32(at)
}

// setupFile writes the state for js/bench/runtimes.mjs.
func (s *benchState) setupFile(b *testing.B) string {
	var out []byte
	rec := func(p []byte) { out = append(binary.BigEndian.AppendUint32(out, uint32(len(p))), p...) }
	rec(abi.AppendManifest(nil, &s.manifest))
	for l := range ckf.MaxLanes {
		rec(s.assignment(l, 1))
		rec(s.snapshot(b, l, 1))
	}
	var t []byte
	for _, x := range s.tokens {
		t = binary.LittleEndian.AppendUint32(t, x)
	}
	rec(t)
	rec(binary.LittleEndian.AppendUint32(nil, benchBlockSize))
	var q []byte
	for _, x := range s.seq {
		q = binary.LittleEndian.AppendUint64(q, x)
	}
	rec(q)
	offs := binary.LittleEndian.AppendUint32(nil, epochByte(b, s.assignment(0, 1), s.assignment(0, 2)))
	rec(binary.LittleEndian.AppendUint32(offs, epochByte(b, s.snapshot(b, 0, 1), s.snapshot(b, 0, 2))))
	path := filepath.Join(b.TempDir(), "setup.bin")
	require.NoError(b, os.WriteFile(path, out, 0o600))
	return path
}

// nodeDriver is one Node process serving every node sub-benchmark.
type nodeDriver struct {
	stdin interface{ Write([]byte) (int, error) }
	sc    *bufio.Scanner
}

// run asks for n timed operations and returns p50, p99 (ns) and lane 15's depth.
func (d *nodeDriver) run(b *testing.B, op string, depth, n int) (p50, p99 float64, got int) {
	_, err := fmt.Fprintf(d.stdin, "%s %d %d\n", op, depth, n)
	require.NoError(b, err)
	require.True(b, d.sc.Scan(), "node driver ended")
	_, err = fmt.Sscanf(d.sc.Text(), "ok %g %g %d", &p50, &p99, &got)
	require.NoError(b, err, d.sc.Text())
	return p50, p99, got
}

func startNode(b *testing.B, s *benchState) *nodeDriver {
	node, err := exec.LookPath("node")
	if err != nil {
		return nil
	}
	// CKF_NODE_FLAGS adds node options, e.g. "--cpu-prof --cpu-prof-dir=/tmp/p"
	// to profile the driver (BENCHMARKS.md "Four runtimes").
	args := append(strings.Fields(os.Getenv("CKF_NODE_FLAGS")), "--no-warnings", filepath.Join(root, "js", "bench", "runtimes.mjs"),
		filepath.Join(root, "wasm", "host", "ckfconsumer.wasm"), s.setupFile(b))
	cmd := exec.Command(node, args...)
	stdin, err := cmd.StdinPipe()
	require.NoError(b, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(b, err)
	cmd.Stderr = os.Stderr
	require.NoError(b, cmd.Start())
	b.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	sc := bufio.NewScanner(stdout)
	require.True(b, sc.Scan() && sc.Text() == "ready", "node driver did not start: %q", sc.Text())
	return &nodeDriver{stdin: stdin, sc: sc}
}

// goImpl is a runtime driven in-process.
type goImpl struct {
	name string
	c    client.Lanes                                    // 16 ready lanes, for queries
	make func(m consumer.Manifest) (client.Lanes, error) // a fresh consumer
}

func closeLanes(c client.Lanes) {
	if cl, ok := c.(interface{ Close() error }); ok {
		_ = cl.Close()
	}
}

func report(b *testing.B, lat []time.Duration) time.Duration {
	slices.Sort(lat)
	p50 := lat[len(lat)/2]
	b.ReportMetric(float64(p50.Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
	return p50
}

func BenchmarkRuntimes(b *testing.B) {
	s := newBenchState(b)
	ctx := context.Background()
	wz, err := host.NewRuntime(ctx, host.NewConfig().WithCompilationCacheDir(filepath.Join(os.TempDir(), "ckfrelay-wazero-cache")))
	require.NoError(b, err)
	b.Cleanup(func() { wz.Close(ctx) })
	wtm := runtime(b)
	impls := []goImpl{
		{name: "native", make: func(m consumer.Manifest) (client.Lanes, error) { return client.NewNative(m) }},
		{name: "wazero", make: func(m consumer.Manifest) (client.Lanes, error) { return wz.NewInstance(ctx, m) }},
		{name: "wasmtime", make: func(m consumer.Manifest) (client.Lanes, error) { return wtm.NewInstance(m) }},
	}
	for i := range impls {
		impls[i].c, err = impls[i].make(s.manifest)
		require.NoError(b, err)
		b.Cleanup(func() { closeLanes(impls[i].c) })
		s.install(b, impls[i].c, ckf.MaxLanes)
	}
	node := startNode(b, s)

	runNode := func(b *testing.B, op string, depth int) (p50 float64) {
		if node == nil {
			b.Skip("node not installed: the Node.js runtime is skipped (install nodejs ≥ 20)")
		}
		b.ResetTimer()
		p50, p99, got := node.run(b, op, depth, b.N)
		b.StopTimer()
		if op == "tokens" || op == "seq" {
			require.Equal(b, depth, got, "lane 15 depth")
		}
		b.ReportMetric(p50, "p50-ns")
		b.ReportMetric(p99, "p99-ns")
		return p50
	}

	for _, op := range []string{"tokens", "seq"} {
		for _, depth := range []int{32, 128, benchDepth} {
			for _, im := range impls {
				b.Run(fmt.Sprintf("op=%s/depth=%d/impl=%s", op, depth, im.name), func(b *testing.B) {
					tokens, seq := s.tokens[:depth*benchBlockSize], s.seq[:depth]
					var res consumer.QueryResult
					lat := make([]time.Duration, 0, 1<<16)
					for b.Loop() {
						t0 := time.Now()
						if op == "tokens" {
							err = im.c.QueryTokens(tokens, benchBlockSize, ckf.BaseSalt, &res)
						} else {
							err = im.c.QuerySequenceHashes(seq, &res)
						}
						if err != nil {
							require.Fail(b, err.Error())
						}
						if len(lat) < cap(lat) {
							lat = append(lat, time.Since(t0))
						}
					}
					require.Equal(b, uint32(depth), res.Depths[15])
					report(b, lat)
				})
			}
			b.Run(fmt.Sprintf("op=%s/depth=%d/impl=node", op, depth), func(b *testing.B) { runNode(b, op, depth) })
		}
	}

	// contains: one export call probing 16 lanes (≈ 100 ns of work), so
	// mostly each host's fixed cost of a call.
	for _, im := range impls {
		b.Run("op=contains/impl="+im.name, func(b *testing.B) {
			lat := make([]time.Duration, 0, 1<<16)
			for b.Loop() {
				t0 := time.Now()
				m, err := im.c.Contains(s.seq[0])
				if err != nil || m != 0xffff {
					require.Fail(b, "contains", "mask %#x, %v", m, err)
				}
				if len(lat) < cap(lat) {
					lat = append(lat, time.Since(t0))
				}
			}
			report(b, lat)
		})
	}
	b.Run("op=contains/impl=node", func(b *testing.B) { runNode(b, "contains", 0) })

	const snapBytes = 8 * benchBuckets
	mbps := func(p50ns float64) float64 { return snapBytes / p50ns * 1e9 / 1e6 }
	for _, im := range impls {
		b.Run("op=install/impl="+im.name, func(b *testing.B) {
			c, err := im.make(s.manifest)
			require.NoError(b, err)
			defer closeLanes(c)
			var lat []time.Duration
			epoch := uint64(1)
			// One install outside the timing: the first one commits the
			// table's pages (a cold page fault per 4 KiB), later ones
			// overwrite them, as a resubscribing router does.
			frame := s.snapshot(b, 0, epoch)
			require.NoError(b, c.Assign(s.ids[0], lease(0, epoch)))
			_, err = c.ApplyFrame(frame)
			require.NoError(b, err)
			for b.Loop() {
				b.StopTimer()
				epoch++
				frame := s.snapshot(b, 0, epoch)
				if err := c.Assign(s.ids[0], lease(0, epoch)); err != nil {
					require.Fail(b, err.Error())
				}
				b.StartTimer()
				t0 := time.Now()
				r, err := c.ApplyFrame(frame)
				lat = append(lat, time.Since(t0))
				if err != nil || r.Outcome != consumer.SnapshotInstalled {
					require.Fail(b, "install", "%+v %v", r, err)
				}
			}
			b.ReportMetric(mbps(float64(report(b, lat).Nanoseconds())), "MB/s")
		})
	}
	b.Run("op=install/impl=node", func(b *testing.B) { b.ReportMetric(mbps(runNode(b, "install", 0)), "MB/s") })

	for _, im := range impls {
		b.Run("op=instantiate/impl="+im.name, func(b *testing.B) {
			var lat []time.Duration
			c, err := im.make(s.manifest) // warm-up, outside the timing
			require.NoError(b, err)
			closeLanes(c)
			for b.Loop() {
				t0 := time.Now()
				c, err := im.make(s.manifest)
				if err != nil {
					require.Fail(b, err.Error())
				}
				if _, err := c.Stats(); err != nil {
					require.Fail(b, err.Error())
				}
				lat = append(lat, time.Since(t0))
				closeLanes(c)
			}
			b.ReportMetric(float64(report(b, lat).Microseconds())/1e3, "p50-ms")
		})
	}
	b.Run("op=instantiate/impl=node", func(b *testing.B) {
		b.ReportMetric(runNode(b, "instantiate", 0)/1e6, "p50-ms")
	})
}
