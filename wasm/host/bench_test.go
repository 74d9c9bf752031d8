package host_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wasm/host"
	"github.com/ckfrelay/ckfrelay/wire"
)

// Benchmarks of the WebAssembly consumer (SPEC §10; targets in BENCHMARKS.md
// "Consumer and WebAssembly consumer"): the native consumer and the wasm
// module through the same client.Lanes interface, side by side in one run
// (impl=native / impl=wasm). Tables are 524,288 buckets × 16 lanes (64 MiB),
// every lane holding the same 50%-loaded filter and one 1024-block request of
// 16-token blocks, so a query of depth D hits D blocks on all 16 lanes (the
// search's worst case: every lane gallops to the end).

const (
	benchBuckets   = 524288
	benchBlockSize = 16
	benchDepth     = 1024
)

type benchEnv struct {
	manifest consumer.Manifest
	ids      [ckf.MaxLanes]ckf.ProducerIdentity
	words    []uint64
	tokens   []uint32
	rt       *host.Runtime
}

var (
	benchOnce sync.Once
	bench     *benchEnv
	benchErr  error
	sinkMask  uint16
)

func benchSetup(b *testing.B) *benchEnv {
	benchOnce.Do(func() {
		e := &benchEnv{}
		f, err := ckf.NewFilter(benchBuckets, ckf.DefaultSeed, ckf.DefaultMaxKicks)
		if err != nil {
			benchErr = err
			return
		}
		rng := rand.New(rand.NewPCG(1, 2))
		e.tokens = make([]uint32, benchDepth*benchBlockSize)
		for i := range e.tokens {
			e.tokens[i] = rng.Uint32()
		}
		locals := ckf.AppendLocalBlockHashes(nil, e.tokens, benchBlockSize, ckf.BaseSalt)
		for _, h := range ckf.AppendSequenceHashes(nil, locals) {
			if err := f.Insert(h); err != nil {
				benchErr = err
				return
			}
		}
		for f.LoadFactor() < 0.5 {
			_ = f.Insert(rng.Uint64())
		}
		e.words = f.Words()
		d := ckf.Domain{CacheSemantics: ckf.ScopedDigest{Digest: [16]byte{7}}}
		e.manifest = consumer.Manifest{ConsumerInstance: 1, Domain: d, Format: ckf.NewFormat(ckf.DefaultSeed, benchBuckets),
			VerificationWindow: consumer.DefaultVerificationWindow}
		for l := range ckf.MaxLanes {
			p := ckf.PoolID{Domain: d, DCID: uint64(l)}
			e.manifest.Lanes[l] = &p
			e.ids[l] = ckf.ProducerIdentity{Pool: p, ProducerIncarnation: 1, LayoutGeneration: 1, Format: e.manifest.Format}
		}
		e.rt, benchErr = host.NewRuntime(context.Background(), host.NewConfig().WithCompilationCacheDir(cacheDir()))
		bench = e
	})
	require.NoError(b, benchErr)
	return bench
}

func (e *benchEnv) lease(l int, epoch uint64) ckf.LaneLease {
	return ckf.LaneLease{ConsumerInstance: 1, PhysicalLane: uint8(l), AssignmentEpoch: epoch}
}

func (e *benchEnv) snapshotFrame(b *testing.B, dst []byte, l int, epoch, seq uint64) []byte {
	f := wire.Frame{Kind: wire.KindSnapshotChunk, Snapshot: wire.SnapshotChunk{Identity: e.ids[l], Lease: e.lease(l, epoch),
		Sequence: seq, ChunkCount: 1, Words: e.words}}
	out, err := wire.AppendFrame(dst[:0], &f)
	require.NoError(b, err)
	return out
}

// impls returns a fresh native consumer and wasm instance, each with the
// first `lanes` lanes ready at epoch 1, sequence 1.
func (e *benchEnv) impls(b *testing.B, lanes int) []struct {
	name string
	c    client.Lanes
} {
	n, err := client.NewNative(e.manifest)
	require.NoError(b, err)
	in, err := e.rt.NewInstance(context.Background(), e.manifest)
	require.NoError(b, err)
	b.Cleanup(func() { in.Close() })
	var frame []byte
	for _, c := range []client.Lanes{n, in} {
		for l := range lanes {
			require.NoError(b, c.Assign(e.ids[l], e.lease(l, 1)))
			frame = e.snapshotFrame(b, frame, l, 1, 1)
			r, err := c.ApplyFrame(frame)
			require.NoError(b, err, "snapshot")
			require.Equal(b, consumer.SnapshotInstalled, r.Outcome, "snapshot: %v", r)
		}
	}
	return []struct {
		name string
		c    client.Lanes
	}{{"native", n}, {"wasm", in}}
}

// BenchmarkQuery: prefix query over 16 ready lanes, by tokens (hashing
// included) and by already-chained sequence hashes; ns/op plus p50/p99 of
// individually timed queries.
func BenchmarkQuery(b *testing.B) {
	e := benchSetup(b)
	impls := e.impls(b, ckf.MaxLanes)
	locals := ckf.AppendLocalBlockHashes(nil, e.tokens, benchBlockSize, ckf.BaseSalt)
	seq := ckf.AppendSequenceHashes(nil, locals)
	for _, by := range []string{"tokens", "seq"} {
		for _, depth := range []int{32, 128, 1024} {
			for _, im := range impls {
				b.Run("by="+by+"/depth="+strconv.Itoa(depth)+"/impl="+im.name, func(b *testing.B) {
					query := func(res *consumer.QueryResult) error {
						if by == "seq" {
							return im.c.QuerySequenceHashes(seq[:depth], res)
						}
						return im.c.QueryTokens(e.tokens[:depth*benchBlockSize], benchBlockSize, ckf.BaseSalt, res)
					}
					var res consumer.QueryResult
					lat := make([]time.Duration, 0, 1<<16)
					b.ReportAllocs()
					for b.Loop() {
						t0 := time.Now()
						if err := query(&res); err != nil {
							require.Fail(b, fmt.Sprint(err))
						}
						if len(lat) < cap(lat) {
							lat = append(lat, time.Since(t0))
						}
					}
					require.Equal(b, uint32(depth), res.Depths[15], "lane 15 depth")
					sinkMask = res.Mask
					slices.Sort(lat)
					b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
					b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
				})
			}
		}
	}
}

// BenchmarkContains is the per-call cost: one probe of 16 lanes.
func BenchmarkContains(b *testing.B) {
	e := benchSetup(b)
	locals := ckf.AppendLocalBlockHashes(nil, e.tokens[:benchBlockSize], benchBlockSize, ckf.BaseSalt)
	for _, im := range e.impls(b, ckf.MaxLanes) {
		b.Run("impl="+im.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				m, err := im.c.Contains(locals[0])
				if err != nil || m != 0xFFFF {
					require.Fail(b, fmt.Sprintf("mask %#x, %v", m, err))
				}
			}
		})
	}
}

// BenchmarkSnapshotInstall installs a whole 4 MiB snapshot on lane 0 (each
// op re-assigns a newer epoch; encoding is outside the timer).
func BenchmarkSnapshotInstall(b *testing.B) {
	e := benchSetup(b)
	for _, im := range e.impls(b, 0) {
		b.Run("impl="+im.name, func(b *testing.B) {
			b.SetBytes(8 * benchBuckets)
			var frame []byte
			epoch := uint64(1)
			for b.Loop() {
				b.StopTimer()
				epoch++
				frame = e.snapshotFrame(b, frame, 0, epoch, epoch)
				require.NoError(b, im.c.Assign(e.ids[0], e.lease(0, epoch)))
				b.StartTimer()
				if r, err := im.c.ApplyFrame(frame); err != nil || r.Outcome != consumer.SnapshotInstalled {
					require.Fail(b, fmt.Sprintf("%v %v", r, err))
				}
			}
		})
	}
}

// BenchmarkDeltaApply applies deltas of 32 absolute images to one lane.
func BenchmarkDeltaApply(b *testing.B) {
	e := benchSetup(b)
	const perDelta, batch = 32, 4096
	rng := rand.New(rand.NewPCG(3, 4))
	frames := make([][]byte, batch)
	for i := range frames {
		d := ckf.Delta{Identity: e.ids[0], Lease: e.lease(0, 1), BaseSequence: uint64(i + 1), Sequence: uint64(i + 2)}
		seen := map[uint32]bool{}
		for len(d.Images) < perDelta {
			bk := uint32(rng.IntN(benchBuckets))
			if !seen[bk] {
				seen[bk] = true
				d.Images = append(d.Images, ckf.BucketImage{Bucket: bk, Word: rng.Uint64()})
			}
		}
		var err error
		frames[i], err = wire.AppendFrame(nil, &wire.Frame{Kind: wire.KindDelta, Delta: d})
		require.NoError(b, err)
	}
	for _, im := range e.impls(b, 1) {
		b.Run("impl="+im.name, func(b *testing.B) {
			// Each pass re-bases by rewinding: re-assign a fresh epoch and
			// reinstall the snapshot at sequence 1 (outside the timer), then
			// the frames' leases must match, so the frames stay at epoch 1
			// and the lane is re-created through a new consumer instead.
			i := 0
			for b.Loop() {
				if i == batch {
					b.StopTimer()
					i = 0
					fresh := e.impls(b, 1)
					for _, f := range fresh {
						if f.name == im.name {
							im.c = f.c
						}
					}
					b.StartTimer()
				}
				if r, err := im.c.ApplyFrame(frames[i]); err != nil || r.Outcome != consumer.Applied {
					require.Fail(b, fmt.Sprintf("delta %d: %v %v", i, r, err))
				}
				i++
			}
			b.ReportMetric(float64(b.N*perDelta)/b.Elapsed().Seconds(), "images/s")
		})
	}
}

// BenchmarkInstantiateConfigure: a ready-to-use consumer of 524,288 buckets
// × 16 lanes. For wasm: a runtime on a warm compilation cache, instantiate,
// _initialize, configure.
func BenchmarkInstantiateConfigure(b *testing.B) {
	e := benchSetup(b)
	ctx := context.Background()
	dir := filepath.Join(os.TempDir(), "ckfrelay-wazero-cache")
	b.Run("impl=native", func(b *testing.B) {
		for b.Loop() {
			n, err := client.NewNative(e.manifest)
			require.NoError(b, err)
			if _, err := n.Stats(); err != nil {
				require.Fail(b, fmt.Sprint(err))
			}
		}
	})
	b.Run("impl=wasm", func(b *testing.B) {
		for b.Loop() {
			rt, err := host.NewRuntime(ctx, host.NewConfig().WithCompilationCacheDir(dir))
			require.NoError(b, err)
			in, err := rt.NewInstance(ctx, e.manifest)
			require.NoError(b, err)
			in.Close()
			rt.Close(ctx)
		}
		b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/op")
	})
}

// BenchmarkQueryParallel: depth-128 token queries from GOMAXPROCS goroutines
// on one instance (serialized) and on a pool of two instances.
func BenchmarkQueryParallel(b *testing.B) {
	e := benchSetup(b)
	ctx := context.Background()
	in := e.impls(b, ckf.MaxLanes)[1].c
	pool, err := e.rt.NewPool(ctx, e.manifest, 2)
	require.NoError(b, err)
	b.Cleanup(func() { pool.Close() })
	var frame []byte
	for l := range ckf.MaxLanes {
		require.NoError(b, pool.Assign(e.ids[l], e.lease(l, 1)))
		frame = e.snapshotFrame(b, frame, l, 1, 1)
		_, err := pool.ApplyFrame(frame)
		require.NoError(b, err)
	}
	req := e.tokens[:128*benchBlockSize]
	for _, im := range []struct {
		name string
		c    client.Lanes
	}{{"instance", in}, {"pool2", pool}} {
		b.Run("impl="+im.name, func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				var res consumer.QueryResult
				for pb.Next() {
					if err := im.c.QueryTokens(req, benchBlockSize, ckf.BaseSalt, &res); err != nil || res.Depths[0] != 128 {
						assert.Fail(b, fmt.Sprintf("query: %v depth %d", err, res.Depths[0]))
						return
					}
				}
			})
		})
	}
}

// mixedWords returns a 50%-loaded table of format f holding every block of
// the benchmark request (so every lane answers depth D, as in
// BenchmarkQuery).
func (e *benchEnv) mixedWords(b *testing.B, f ckf.Format) []uint64 {
	filter, err := ckf.NewFilter(int(f.BucketCount), f.Seed, ckf.DefaultMaxKicks)
	require.NoError(b, err)
	for _, h := range ckf.AppendTokenSequenceHashes(nil, e.tokens, benchBlockSize, ckf.BaseSalt) {
		require.NoError(b, filter.Insert(h))
	}
	rng := rand.New(rand.NewPCG(3, uint64(f.BucketCount)))
	for filter.LoadFactor() < 0.5 {
		_ = filter.Insert(rng.Uint64())
	}
	return filter.Words()
}

// mixedImpl returns a wasm instance (and a native consumer) with 16 ready
// lanes in four format groups of four lanes (four pool sizes, 2^19 down to
// 2^16 buckets; one seed or four), every lane holding the request.
func (e *benchEnv) mixedImpls(b *testing.B, seeds int) []struct {
	name string
	c    client.Lanes
} {
	m := e.manifest
	m.Format = ckf.Format{} // a version-2 manifest: formats from the assignments
	n, err := client.NewNative(m)
	require.NoError(b, err)
	in, err := e.rt.NewInstance(context.Background(), m)
	require.NoError(b, err)
	b.Cleanup(func() { in.Close() })
	var words [4][]uint64
	var formats [4]ckf.Format
	for g := range 4 {
		seed := ckf.DefaultSeed
		if seeds == 4 {
			seed += uint64(g) * 0x9E3779B97F4A7C15
		}
		formats[g] = ckf.NewFormat(seed, benchBuckets>>g)
		words[g] = e.mixedWords(b, formats[g])
	}
	for _, c := range []client.Lanes{n, in} {
		for l := range ckf.MaxLanes {
			id := e.ids[l]
			id.Format = formats[l%4]
			require.NoError(b, c.Assign(id, e.lease(l, 1)))
			frame, err := wire.AppendFrame(nil, &wire.Frame{Kind: wire.KindSnapshotChunk, Snapshot: wire.SnapshotChunk{Identity: id,
				Lease: e.lease(l, 1), Sequence: 1, ChunkCount: 1, Words: words[l%4]}})
			require.NoError(b, err)
			r, err := c.ApplyFrame(frame)
			require.NoError(b, err, "snapshot")
			require.Equal(b, consumer.SnapshotInstalled, r.Outcome, "snapshot: %v", r)
		}
	}
	return []struct {
		name string
		c    client.Lanes
	}{{"native", n}, {"wasm", in}}
}

// BenchmarkQueryMixed: a 1024-block query over 16 ready lanes in four
// format groups of four lanes (mixed4) against the same lanes in one 16-lane
// group (uniform, BenchmarkQuery's table), by tokens and by sequence hashes,
// with one seed or four. Each op runs one query of each layout, in turns
// (mixed4 first in even ops, uniform first in odd ones), each timed on its
// own: their p50s (mixed4-p50-ns, uniform-p50-ns) and the ratio of the two
// (mixed4/uniform, the figure) come from the same stretch of time, so a burst
// of load on the shared machine slows both layouts alike. Two sub-benchmarks
// run one after the other did not: one's p50 could be taken in a quiet
// moment and the other's in a burst (BENCHMARKS.md, "Format groups").
func BenchmarkQueryMixed(b *testing.B) {
	e := benchSetup(b)
	seq := ckf.AppendTokenSequenceHashes(nil, e.tokens, benchBlockSize, ckf.BaseSalt)
	uniform := e.impls(b, ckf.MaxLanes)
	for _, seeds := range []int{1, 4} {
		mixed := e.mixedImpls(b, seeds)
		for _, by := range []string{"tokens", "seq"} {
			for k := range mixed {
				b.Run(fmt.Sprintf("by=%s/seeds=%d/impl=%s", by, seeds, mixed[k].name), func(b *testing.B) {
					layouts := [2]client.Lanes{mixed[k].c, uniform[k].c}
					var res [2]consumer.QueryResult
					var lat [2][]time.Duration
					for j := range lat {
						lat[j] = make([]time.Duration, 0, 1<<16)
					}
					query := func(j int) {
						t0 := time.Now()
						var err error
						if by == "seq" {
							err = layouts[j].QuerySequenceHashes(seq, &res[j])
						} else {
							err = layouts[j].QueryTokens(e.tokens, benchBlockSize, ckf.BaseSalt, &res[j])
						}
						if err != nil {
							require.Fail(b, fmt.Sprint(err))
						}
						if len(lat[j]) < cap(lat[j]) {
							lat[j] = append(lat[j], time.Since(t0))
						}
					}
					b.ReportAllocs()
					i := 0
					for b.Loop() {
						query(i & 1)
						query(1 - i&1)
						i++
					}
					for j, name := range []string{"mixed4", "uniform"} {
						for l := range ckf.MaxLanes {
							require.Equal(b, uint32(benchDepth), res[j].Depths[l], "%s: lane %d depth", name, l)
						}
					}
					require.Equal(b, res[1].Probes, res[0].Probes, "probes")
					p50 := [2]float64{}
					for j, name := range []string{"mixed4", "uniform"} {
						slices.Sort(lat[j])
						p50[j] = float64(lat[j][len(lat[j])/2].Nanoseconds())
						b.ReportMetric(p50[j], name+"-p50-ns")
						b.ReportMetric(float64(lat[j][len(lat[j])*99/100].Nanoseconds()), name+"-p99-ns")
					}
					b.ReportMetric(p50[0]/p50[1], "mixed4/uniform")
					b.ReportMetric(float64(res[0].Probes), "probes/op")
				})
			}
		}
	}
}
