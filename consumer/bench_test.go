package consumer

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire"
)

// benchBuckets is the relay default table: 1,048,576 expected blocks.
const (
	benchBuckets   = 524288
	benchBlockSize = 16
)

var (
	benchSink  uint32
	benchTable *benchFixture // built on first use: 64 MiB, ~0.5 s
)

// benchFixture is a 16-lane consumer at 50% load (2 of 4 slots a bucket
// filled with random fingerprints) whose lanes also hold prefixes of one
// request per benchmarked depth: for a request of D blocks, lane l holds its
// first D*(16-l)/16 blocks, so the lanes answer 16 different depths.
type benchFixture struct {
	c        *Consumer
	epoch    uint64
	requests map[int][]uint32 // depth → tokens
}

func getBenchFixture(b *testing.B) *benchFixture {
	b.Helper()
	if benchTable != nil {
		return benchTable
	}
	c, err := New(testManifest(lanes, benchBuckets))
	require.NoError(b, err)
	f := &benchFixture{c: c, epoch: 1, requests: map[int][]uint32{}}
	rng := ckf.NewRNG(42)
	col := make([][]uint64, lanes)
	for l := range lanes {
		col[l] = make([]uint64, benchBuckets)
		for i := range col[l] {
			r := rng.Next()
			col[l][i] = uint64(uint16(r)|1) | uint64(uint16(r>>16)|1)<<16
		}
	}
	for _, d := range []int{32, 128, 1024} {
		tokens := make([]uint32, d*benchBlockSize)
		for i := range tokens {
			tokens[i] = uint32(rng.Next())
		}
		f.requests[d] = tokens
		seq := ckf.AppendSequenceHashes(nil, ckf.AppendLocalBlockHashes(nil, tokens, benchBlockSize, ckf.BaseSalt))
		for l := range lanes {
			for _, h := range seq[:d*(lanes-l)/lanes] {
				ad := c.addresser.Address(h)
				if !place(col[l], ad.A, ad.Fingerprint) && !place(col[l], ad.B, ad.Fingerprint) {
					require.Fail(b, fmt.Sprintf("lane %d: both buckets full", l))
				}
			}
		}
	}
	for l := range lanes {
		f.install(b, l, col[l])
	}
	benchTable = f
	return f
}

func (f *benchFixture) install(b *testing.B, l int, words []uint64) {
	f.epoch++
	lease := testLease(l, f.epoch)
	id := testIdentity(l, benchBuckets)
	require.NoError(b, f.c.Assign(id, lease))
	r := f.c.InstallSnapshot(&ckf.Snapshot{Identity: id, Lease: lease, Sequence: 1, Words: words})
	require.Equal(b, SnapshotInstalled, r.Outcome, "got %v", r)
}

// setReady makes lanes 0..k-1 ready and retires the others, keeping words.
func (f *benchFixture) setReady(b *testing.B, k int) {
	for l := range lanes {
		ready := f.c.ready&(1<<l) != 0
		switch {
		case l >= k && ready:
			require.NoError(b, f.c.Retire(l))
		case l < k && !ready:
			words, _ := f.c.AppendLaneWords(nil, l)
			f.install(b, l, words)
		}
	}
}

// reportLatency records p50/p99 of per-query durations as metrics.
func reportLatency(b *testing.B, d []time.Duration) {
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(d[len(d)*99/100].Nanoseconds()), "p99-ns")
}

// BenchmarkConsumerQuery measures one prefix query, hashing included:
// by=tokens hashes 16-token blocks, chains and searches; by=locals starts
// from local block hashes (chain hashing and search).
func BenchmarkConsumerQuery(b *testing.B) {
	for _, by := range []string{"tokens", "locals"} {
		for _, depth := range []int{32, 128, 1024} {
			for _, k := range []int{1, 4, 16} {
				b.Run(fmt.Sprintf("by=%s/depth=%d/lanes=%d", by, depth, k), func(b *testing.B) {
					f := getBenchFixture(b)
					f.setReady(b, k)
					tokens := f.requests[depth]
					locals := ckf.AppendLocalBlockHashes(nil, tokens, benchBlockSize, ckf.BaseSalt)
					var res QueryResult
					query := func() error { return f.c.QueryTokens(tokens, benchBlockSize, ckf.BaseSalt, &res) }
					if by == "locals" {
						query = func() error { return f.c.Query(locals, &res) }
					}
					require.NoError(b, query())
					require.Equal(b, uint32(depth), res.Depths[0], "lane 0: got depth %d, want %d", res.Depths[0], depth)
					probes := 0
					d := make([]time.Duration, b.N)
					b.ReportAllocs()
					b.ResetTimer()
					for i := range b.N {
						t0 := time.Now()
						_ = query()
						d[i] = time.Since(t0)
						probes += res.Probes
					}
					b.StopTimer()
					benchSink += res.Depths[0]
					reportLatency(b, d)
					b.ReportMetric(float64(probes)/float64(b.N), "probes/op")
				})
			}
		}
	}
}

// BenchmarkConsumerApplyDelta applies 64-image deltas to one ready lane.
func BenchmarkConsumerApplyDelta(b *testing.B) {
	const images = 64
	for _, path := range []string{"struct", "bytes"} {
		b.Run("path="+path, func(b *testing.B) {
			f := getBenchFixture(b)
			f.setReady(b, 16)
			st, _ := f.c.LaneStatus(0)
			seq := st.InstalledSequence
			rng := ckf.NewRNG(7)
			deltas := make([]ckf.Delta, 256)
			for i := range deltas {
				d := &deltas[i]
				d.Identity, d.Lease = st.Identity, st.Lease
				for len(d.Images) < images {
					bk := uint32(rng.Next() % benchBuckets)
					if !slices.ContainsFunc(d.Images, func(im ckf.BucketImage) bool { return im.Bucket == bk }) {
						d.Images = append(d.Images, ckf.BucketImage{Bucket: bk, Word: rng.Next()})
					}
				}
			}
			var fr wire.Frame
			var buf []byte
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				d := &deltas[i%len(deltas)]
				d.BaseSequence, d.Sequence = seq, seq+1
				var r Result
				if path == "bytes" {
					// Encoding (the producer's work) is not timed.
					b.StopTimer()
					fr.Kind, fr.Delta = wire.KindDelta, *d
					buf, _ = wire.AppendFrame(buf[:0], &fr)
					b.StartTimer()
					r, _ = f.c.ApplyFrameBytes(buf)
				} else {
					r = f.c.ApplyDelta(d)
				}
				if r.Outcome != Applied {
					require.Fail(b, fmt.Sprintf("got %v", r))
				}
				seq++
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N*images)/b.Elapsed().Seconds(), "images/s")
		})
	}
}

// BenchmarkConsumerInstallSnapshot installs a 524,288-bucket (4 MiB) snapshot
// into one lane: from words, or from 8 MiB-limited wire frames (decode
// included, payload copied straight into the table).
func BenchmarkConsumerInstallSnapshot(b *testing.B) {
	for _, path := range []string{"words", "frames"} {
		b.Run("path="+path, func(b *testing.B) {
			f := getBenchFixture(b)
			f.setReady(b, 16)
			words, _ := f.c.AppendLaneWords(nil, 3)
			id := testIdentity(3, benchBuckets)
			var chunks []wire.SnapshotChunk
			if path == "frames" {
				var err error
				chunks, err = wire.SplitSnapshot(&ckf.Snapshot{Identity: id, Sequence: 1, Words: words}, 8<<20)
				require.NoError(b, err)
			}
			var buf []byte
			b.SetBytes(benchBuckets * 8)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				f.epoch++
				lease := testLease(3, f.epoch)
				if err := f.c.Assign(id, lease); err != nil {
					require.Fail(b, fmt.Sprint(err))
				}
				var r Result
				if path == "frames" {
					for i := range chunks {
						// Encoding (the producer's work) is not timed.
						b.StopTimer()
						chunks[i].Lease = lease
						var err error
						if buf, err = wire.AppendFrame(buf[:0], &wire.Frame{Kind: wire.KindSnapshotChunk, Snapshot: chunks[i]}); err != nil {
							require.Fail(b, fmt.Sprint(err))
						}
						b.StartTimer()
						if r, err = f.c.ApplyFrameBytes(buf); err != nil {
							require.Fail(b, fmt.Sprint(err))
						}
					}
				} else {
					r = f.c.InstallSnapshot(&ckf.Snapshot{Identity: id, Lease: lease, Sequence: 1, Words: words})
				}
				if r.Outcome != SnapshotInstalled {
					require.Fail(b, fmt.Sprintf("got %v", r))
				}
			}
		})
	}
}

// mixedBenchFormats are the formats of BenchmarkConsumerQueryMixed's four
// groups: four pool sizes (2^19 down to 2^16 buckets), with one seed or
// four.
func mixedBenchFormats(seeds int) [4]ckf.Format {
	var fs [4]ckf.Format
	for g := range fs {
		seed := uint64(testSeed)
		if seeds == 4 {
			seed += uint64(g) * 0x9E3779B97F4A7C15
		}
		fs[g] = ckf.NewFormat(seed, benchBuckets>>g)
	}
	return fs
}

// mixedBench is a consumer with 16 ready lanes at 50% load holding the
// d1024_l16 pattern of BenchmarkConsumerQuery (lane l holds the first
// 1024*(16-l)/16 blocks of one request), laid out as one 16-lane group
// (uniform: the version-1 table) or four groups of four lanes (mixed4).
func mixedBench(b *testing.B, mixed bool, seeds int) (*Consumer, []uint32) {
	b.Helper()
	const depth = 1024
	m := testManifest(lanes, benchBuckets)
	fs := [4]ckf.Format{m.Format, m.Format, m.Format, m.Format}
	if mixed {
		m.Format = ckf.Format{}
		fs = mixedBenchFormats(seeds)
	}
	c, err := New(m)
	require.NoError(b, err)
	rng := ckf.NewRNG(42)
	tokens := make([]uint32, depth*benchBlockSize)
	for i := range tokens {
		tokens[i] = uint32(rng.Next())
	}
	seq := ckf.AppendTokenSequenceHashes(nil, tokens, benchBlockSize, ckf.BaseSalt)
	for l := range lanes {
		f := fs[l%4] // lanes 0, 4, 8, 12 share a group: every group answers four depths
		words := make([]uint64, f.BucketCount)
		for i := range words {
			r := rng.Next()
			words[i] = uint64(uint16(r)|1) | uint64(uint16(r>>16)|1)<<16
		}
		ad := f.Addresser()
		for _, h := range seq[:depth*(lanes-l)/lanes] {
			a := ad.Address(h)
			if !place(words, a.A, a.Fingerprint) && !place(words, a.B, a.Fingerprint) {
				require.Fail(b, fmt.Sprintf("lane %d: both buckets full", l))
			}
		}
		id := testIdentity(l, f.BucketCount)
		id.Format = f
		lease := testLease(l, 1)
		require.NoError(b, c.Assign(id, lease))
		r := c.InstallSnapshot(&ckf.Snapshot{Identity: id, Lease: lease, Sequence: 1, Words: words})
		require.Equal(b, SnapshotInstalled, r.Outcome, "got %v", r)
	}
	require.Equal(b, !mixed, c.uniform)
	return c, tokens
}

// BenchmarkConsumerQueryMixed: a 1024-block query over 16 ready lanes in
// four format groups of four lanes (mixed4; four pool sizes, one seed or
// four) against the same lanes in one 16-lane group (uniform), by=tokens
// hashing the tokens first, by=seq starting from sequence hashes (the search
// alone, the real test of the groups' probe cost). Each op runs one query of
// each layout, in turns (mixed4 first in even ops, uniform first in odd
// ones), each timed on its own: their p50s (mixed4-p50-ns, uniform-p50-ns)
// and the ratio of the two (mixed4/uniform, the figure) come from the same
// stretch of time, so a burst of load on the shared machine slows both
// layouts alike (BENCHMARKS.md, "Format groups").
func BenchmarkConsumerQueryMixed(b *testing.B) {
	for _, by := range []string{"tokens", "seq"} {
		for _, seeds := range []int{1, 4} {
			b.Run(fmt.Sprintf("by=%s/seeds=%d", by, seeds), func(b *testing.B) {
				var cs [2]*Consumer
				var tokens [2][]uint32
				cs[0], tokens[0] = mixedBench(b, true, seeds)
				cs[1], tokens[1] = mixedBench(b, false, seeds)
				require.Equal(b, tokens[0], tokens[1], "both layouts hold one request")
				seq := ckf.AppendTokenSequenceHashes(nil, tokens[0], benchBlockSize, ckf.BaseSalt)
				var res [2]QueryResult
				query := func(j int) error {
					if by == "seq" {
						return cs[j].QuerySequenceHashes(seq, &res[j])
					}
					return cs[j].QueryTokens(tokens[0], benchBlockSize, ckf.BaseSalt, &res[j])
				}
				for j := range cs {
					require.NoError(b, query(j))
					for l := range lanes {
						require.GreaterOrEqual(b, res[j].Depths[l], uint32(1024*(lanes-l)/lanes), "layout %d lane %d", j, l)
					}
				}
				require.Equal(b, res[1].Probes, res[0].Probes, "probes")
				var lat [2][]time.Duration
				for j := range lat {
					lat[j] = make([]time.Duration, 0, 1<<16)
				}
				timed := func(j int) {
					t0 := time.Now()
					_ = query(j)
					if len(lat[j]) < cap(lat[j]) {
						lat[j] = append(lat[j], time.Since(t0))
					}
				}
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					timed(i & 1)
					timed(1 - i&1)
					i++
				}
				benchSink += res[0].Depths[0] + res[1].Depths[0]
				var p50 [2]float64
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
