package ckf_test

// Side-by-side benchmarks for package ckf. `make bench` (internal/cmd/benchsummary)
// runs them and turns pairs measured in the same run into BENCH ratio lines;
// BENCHMARKS.md explains every figure and records measured numbers.
//
// Sizing of the filter comparison: n = 1,000,000 keys go into 2^18 buckets of
// four slots (1,048,576 slots, 95.4% load) for both cuckoo filters. That is
// exactly what github.com/seiflotfy/cuckoofilter allocates for a capacity of
// 1M, so both cuckoo filters run at the same load and slot count, and 95% is
// the stress point for a cuckoo filter: relocation chains are longest and the
// false-positive rate (≈ 8·load/2^f) is highest. ckf's design load (SPEC §2.1,
// 80%) can only be easier. The Bloom filter gets the same memory as ckf
// (2 MiB = 16.8 bits per key) with the optimal number of hash functions.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/bits-and-blooms/bloom/v3"
	"github.com/ckfrelay/ckfrelay/ckf"
	cuckoo "github.com/seiflotfy/cuckoofilter"
	"github.com/stretchr/testify/require"
)

// Package-level sinks keep the compiler from discarding benchmarked results.
var (
	sinkBool    bool
	sinkU64     uint64
	sinkOutcome ckf.ApplyOutcome
)

const (
	filterKeys    = 1_000_000
	filterBuckets = 1 << 18 // ×4 slots = 1,048,576 slots: 95.4% load at filterKeys
	fprProbes     = 1 << 20 // absent keys probed to measure the false-positive rate
)

// benchKey is a bijection on uint64 (the SplitMix64 output finalizer applied to
// i+γ), so benchKey(i) for distinct i are distinct keys. Present keys are
// benchKey(0..n); absent keys are benchKey(n..), disjoint by construction.
func benchKey(i uint64) uint64 {
	x := i + 0x9E3779B97F4A7C15
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
	x = (x ^ (x >> 27)) * 0x94D049BB133111EB
	return x ^ (x >> 31)
}

// benchKeys returns the present and absent key sets, built on first use so
// that the package's tests and fuzz workers do not pay for them.
var benchKeys = sync.OnceValues(func() (present, absent []uint64) {
	present = make([]uint64, filterKeys)
	for i := range present {
		present[i] = benchKey(uint64(i))
	}
	absent = make([]uint64, fprProbes)
	for i := range absent {
		absent[i] = benchKey(uint64(filterKeys + i))
	}
	return present, absent
})

// approxFilter is the common surface of the compared filters. Every library
// pays the same interface call; the peers that take []byte also pay an 8-byte
// little-endian encoding of the key into a buffer the adapter owns.
type approxFilter interface {
	insert(key uint64) bool
	contains(key uint64) bool
	bytes() int
}

type ckfFilter struct{ f *ckf.Filter }

func (c *ckfFilter) insert(key uint64) bool   { return c.f.Insert(key) == nil }
func (c *ckfFilter) contains(key uint64) bool { return c.f.Contains(key) }
func (c *ckfFilter) bytes() int               { return c.f.BucketCount() * 8 }

type seiflotfyFilter struct {
	f   *cuckoo.Filter
	buf [8]byte
}

func (s *seiflotfyFilter) insert(key uint64) bool {
	binary.LittleEndian.PutUint64(s.buf[:], key)
	return s.f.Insert(s.buf[:])
}

func (s *seiflotfyFilter) contains(key uint64) bool {
	binary.LittleEndian.PutUint64(s.buf[:], key)
	return s.f.Lookup(s.buf[:])
}

// bytes is one 8-bit fingerprint per slot; the library sizes its slots as
// next_pow2(capacity).
func (s *seiflotfyFilter) bytes() int { return filterBuckets * 4 }

type bloomFilter struct {
	f   *bloom.BloomFilter
	buf [8]byte
}

func (b *bloomFilter) insert(key uint64) bool {
	binary.LittleEndian.PutUint64(b.buf[:], key)
	b.f.Add(b.buf[:])
	return true
}

func (b *bloomFilter) contains(key uint64) bool {
	binary.LittleEndian.PutUint64(b.buf[:], key)
	return b.f.Test(b.buf[:])
}

func (b *bloomFilter) bytes() int { return int(b.f.Cap() / 8) }

type filterLib struct {
	name string
	new  func(tb testing.TB) approxFilter
}

var filterLibs = []filterLib{
	{"ckf", func(tb testing.TB) approxFilter {
		f, err := ckf.NewFilter(filterBuckets, ckf.DefaultSeed, ckf.DefaultMaxKicks)
		require.NoError(tb, err, "NewFilter")
		return &ckfFilter{f: f}
	}},
	{"seiflotfy", func(testing.TB) approxFilter {
		return &seiflotfyFilter{f: cuckoo.NewFilter(filterKeys)}
	}},
	{"bloom", func(testing.TB) approxFilter {
		m := uint(filterBuckets * 64) // the same bits as ckf
		k := uint(math.Round(math.Ln2 * float64(m) / filterKeys))
		return &bloomFilter{f: bloom.New(m, k)}
	}},
}

// fullFilter is a filter holding every present key, with its measured
// false-positive rate. Built once per library per process.
type fullFilter struct {
	f        approxFilter
	fpr      float64
	failures int
}

var fullFilters = map[string]*fullFilter{}

func full(b *testing.B, lib filterLib) *fullFilter {
	if ff, ok := fullFilters[lib.name]; ok {
		return ff
	}
	presentKeys, absentKeys := benchKeys()
	ff := &fullFilter{f: lib.new(b)}
	for _, k := range presentKeys {
		if !ff.f.insert(k) {
			ff.failures++
		}
	}
	for _, k := range presentKeys {
		if !ff.f.contains(k) {
			require.Fail(b, fmt.Sprintf("lib=%s: inserted key %#x not found (false negative), insert failures %d", lib.name, k, ff.failures))
		}
	}
	positives := 0
	for _, k := range absentKeys {
		if ff.f.contains(k) {
			positives++
		}
	}
	ff.fpr = float64(positives) / float64(len(absentKeys))
	fullFilters[lib.name] = ff
	return ff
}

func reportFilter(b *testing.B, ff *fullFilter) {
	b.ReportMetric(ff.fpr, "fpr")
	b.ReportMetric(float64(ff.f.bytes()*8)/filterKeys, "bits/key")
}

// BenchmarkFilterInsert measures filling an empty filter with filterKeys keys
// (load 0 → 95.4%): one op is one whole fill, so every run averages over the
// same load curve; ns/insert is the figure to compare. The empty filter is
// allocated with the timer stopped.
func BenchmarkFilterInsert(b *testing.B) {
	for _, lib := range filterLibs {
		b.Run("lib="+lib.name+"/n=1M", func(b *testing.B) {
			ff := full(b, lib)
			presentKeys, _ := benchKeys()
			failures := 0
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				f := lib.new(b)
				b.StartTimer()
				for _, k := range presentKeys {
					if !f.insert(k) {
						failures++
					}
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(presentKeys)), "ns/insert")
			reportFilter(b, ff)
			if failures > 0 {
				b.ReportMetric(float64(failures)/float64(b.N), "failures/op")
			}
		})
	}
}

// BenchmarkFilterLookup measures one Contains on a filter holding filterKeys
// keys: hit probes inserted keys, miss probes keys never inserted.
func BenchmarkFilterLookup(b *testing.B) {
	presentKeys, absentKeys := benchKeys()
	for _, probe := range []struct {
		name string
		keys []uint64
	}{{"hit", presentKeys}, {"miss", absentKeys}} {
		for _, lib := range filterLibs {
			b.Run(probe.name+"/lib="+lib.name+"/n=1M", func(b *testing.B) {
				ff := full(b, lib)
				keys := probe.keys
				b.ReportAllocs()
				b.ResetTimer()
				j := 0
				for range b.N {
					sinkBool = ff.f.contains(keys[j])
					j++
					if j == len(keys) {
						j = 0
					}
				}
				b.StopTimer()
				reportFilter(b, ff)
			})
		}
	}
}

// Pool workload: poolMembers members each extend one long chain by Stored
// events of chainBlocks blocks whose parent is the member's previous event's
// last block. A steady-state step stores one new event and removes the same
// member's oldest event, so the resident count holds at the target load.
const (
	poolExpected = 1 << 20 // ExpectedBlocks; 524,288 buckets, 2,097,152 slots
	chainBlocks  = 16
	poolMembers  = 8
	poolCadence  = 16 // relay default publish_every_n_events
)

// blockIndex is the exact bookkeeping under test: the ckf pool, or the
// map-only baseline.
type blockIndex interface {
	apply(ev *ckf.RouterEvent) error
}

type poolIndex struct{ p *ckf.Pool }

func newPoolIndex(tb testing.TB) *poolIndex {
	cfg := ckf.DefaultConfig()
	cfg.ExpectedBlocks = poolExpected
	cfg.PublishEveryNEvents = poolCadence
	p, err := ckf.NewPool(cfg)
	require.NoError(tb, err, "NewPool")
	return &poolIndex{p: p}
}

func (x *poolIndex) apply(ev *ckf.RouterEvent) error {
	sinkOutcome = x.p.ApplyEvent(ev)
	return sinkOutcome.FirstError
}

// mapIndex is the baseline: the same exact bookkeeping as ckf.Pool for device
// Stored/Removed events (per-member lineage external → canonical, canonical
// chaining, whole-event validation, refcounts) with plain Go maps and no
// filter, dirty window or publication.
type mapIndex struct {
	lineage map[ckf.Member]map[uint64]uint64
	owners  map[uint64]uint32
	canon   []uint64
}

func newMapIndex() *mapIndex {
	return &mapIndex{lineage: map[ckf.Member]map[uint64]uint64{}, owners: map[uint64]uint32{}}
}

var errBaseline = errors.New("baseline: invalid event")

func (x *mapIndex) apply(ev *ckf.RouterEvent) error {
	m := ev.Member()
	lin := x.lineage[m]
	switch ev.Kind {
	case ckf.EventStored:
		canon := x.canon[:0]
		var prev uint64
		if ev.HasParent {
			var ok bool
			if prev, ok = lin[ev.ParentHash]; !ok {
				return errBaseline
			}
		}
		for i, blk := range ev.Blocks {
			c := blk.TokensHash
			if i > 0 || ev.HasParent {
				c = ckf.ChainHash(prev, blk.TokensHash)
			}
			if old, ok := lin[blk.BlockHash]; ok && old != c {
				return errBaseline
			}
			for _, e := range ev.Blocks[:i] {
				if e.BlockHash == blk.BlockHash {
					return errBaseline
				}
			}
			canon = append(canon, c)
			prev = c
		}
		x.canon = canon
		if lin == nil {
			lin = make(map[uint64]uint64, len(ev.Blocks))
			x.lineage[m] = lin
		}
		for i, blk := range ev.Blocks {
			if _, ok := lin[blk.BlockHash]; ok {
				continue
			}
			lin[blk.BlockHash] = canon[i]
			x.owners[canon[i]]++
		}
	case ckf.EventRemoved:
		for _, h := range ev.BlockHashes {
			c, ok := lin[h]
			if !ok {
				continue
			}
			delete(lin, h)
			if n := x.owners[c]; n > 1 {
				x.owners[c] = n - 1
			} else {
				delete(x.owners, c)
			}
		}
	}
	return nil
}

// chainWorkload generates the pool workload deterministically. Its memory is
// allocated up front so that it does not count as exact state.
type chainWorkload struct {
	next   uint64                  // block counter; block i has external hash benchKey(2i)
	chains [poolMembers][][]uint64 // per member, a ring of its events' external hashes
	head   [poolMembers]int        // oldest event in the ring
	size   [poolMembers]int        // events in the ring
	last   [poolMembers]uint64     // last external hash stored by the member
	store  ckf.RouterEvent         // reused Stored event
	remove ckf.RouterEvent         // reused Removed event
	blocks [chainBlocks]ckf.StoredBlock
	hashes [chainBlocks]uint64
	member int
}

func newChainWorkload(residentBlocks int) *chainWorkload {
	w := &chainWorkload{}
	events := (residentBlocks + chainBlocks - 1) / chainBlocks
	// Room for every member's share of the fill plus the one event a step
	// stores before it removes the oldest.
	perMember := (events+poolMembers-1)/poolMembers + 1
	for m := range w.chains {
		w.chains[m] = make([][]uint64, perMember)
		for i := range w.chains[m] {
			w.chains[m][i] = make([]uint64, chainBlocks)
		}
	}
	w.store = ckf.RouterEvent{Kind: ckf.EventStored, Blocks: w.blocks[:]}
	w.remove = ckf.RouterEvent{Kind: ckf.EventRemoved, BlockHashes: w.hashes[:]}
	return w
}

// storeNext applies the next member's next Stored event (round robin).
func (w *chainWorkload) storeNext(x blockIndex) error {
	m := w.member
	w.member = (w.member + 1) % poolMembers
	ring := w.chains[m]
	slot := ring[(w.head[m]+w.size[m])%len(ring)]
	for i := range w.blocks {
		w.blocks[i] = ckf.StoredBlock{BlockHash: benchKey(2 * w.next), TokensHash: benchKey(2*w.next + 1)}
		slot[i] = w.blocks[i].BlockHash
		w.next++
	}
	w.store.WorkerID = uint64(m)
	w.store.HasParent = w.size[m] > 0
	w.store.ParentHash = w.last[m]
	w.size[m]++
	w.last[m] = slot[chainBlocks-1]
	return x.apply(&w.store)
}

// removeOldest applies a Removed event for member m's oldest stored event.
func (w *chainWorkload) removeOldest(x blockIndex, m int) error {
	ring := w.chains[m]
	copy(w.hashes[:], ring[w.head[m]])
	w.head[m] = (w.head[m] + 1) % len(ring)
	w.size[m]--
	w.remove.WorkerID = uint64(m)
	return x.apply(&w.remove)
}

// fill stores events until the index tracks at least blocks blocks.
func (w *chainWorkload) fill(x blockIndex, blocks int) error {
	for range (blocks + chainBlocks - 1) / chainBlocks {
		if err := w.storeNext(x); err != nil {
			return err
		}
	}
	return nil
}

// step stores one event and removes the oldest event of the same member.
func (w *chainWorkload) step(x blockIndex) error {
	m := w.member
	if err := w.storeNext(x); err != nil {
		return err
	}
	return w.removeOldest(x, m)
}

// prefilled caches the one pre-filled index in use, so that the b.N ramp-up
// of a sub-benchmark continues from the steady state instead of rebuilding
// it; a different sub-benchmark replaces (and frees) it.
var prefilled struct {
	key string
	x   blockIndex
	w   *chainWorkload
}

func prefill(b *testing.B, key string, newIndex func() blockIndex, blocks int) (blockIndex, *chainWorkload) {
	if prefilled.key == key {
		return prefilled.x, prefilled.w
	}
	prefilled.x, prefilled.w, prefilled.key = nil, nil, ""
	runtime.GC()
	x, w := newIndex(), newChainWorkload(blocks)
	require.NoError(b, w.fill(x, blocks), "prefill %s", key)
	prefilled.key, prefilled.x, prefilled.w = key, x, w
	return x, w
}

// BenchmarkPoolApplyEvent measures ckf.Pool.ApplyEvent against the map-only
// baseline at 50% and 90% of ExpectedBlocks = 1,048,576 resident blocks (filter
// slot load 25% and 45%: the SPEC's bucket-count rounding doubles the table
// for a power-of-two n). One op stores a 16-block event chained to the
// member's previous event and removes the member's oldest 16-block event;
// blocks/s counts the stored blocks.
func BenchmarkPoolApplyEvent(b *testing.B) {
	for _, load := range []int{50, 90} {
		blocks := poolExpected * load / 100
		for _, impl := range []struct {
			name string
			new  func() blockIndex
		}{
			{"pool", func() blockIndex { return newPoolIndex(b) }},
			{"map", func() blockIndex { return newMapIndex() }},
		} {
			b.Run(fmt.Sprintf("load=%d/impl=%s", load, impl.name), func(b *testing.B) {
				x, w := prefill(b, b.Name(), impl.new, blocks)
				b.ReportAllocs()
				b.ResetTimer()
				cpu0 := processCPU()
				for range b.N {
					if err := w.step(x); err != nil {
						require.Fail(b, fmt.Sprintf("step: %v", err))
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
				b.ReportMetric(float64(b.N*chainBlocks)/b.Elapsed().Seconds(), "blocks/s")
				if p, ok := x.(*poolIndex); ok {
					st := p.p.Stats()
					require.Equal(b, uint64(0), st.CapacityFailures, "capacity failures %d, resident %d of %d unique: want every block resident", st.CapacityFailures, st.ResidentBlocks, st.UniqueBlocks)
					require.Equal(b, uint64(st.UniqueBlocks), st.ResidentBlocks, "capacity failures %d, resident %d of %d unique: want every block resident", st.CapacityFailures, st.ResidentBlocks, st.UniqueBlocks)
				}
			})
		}
	}
}

// BenchmarkPoolExactState builds an index of ExpectedBlocks = 1,048,576 blocks
// (8 members, 16-block chained events) and measures the live heap its exact
// state takes, per tracked block, with runtime.MemStats after a GC. For the
// pool the filter and dirty window are allocated before the first reading, so
// the difference is lineage, ownership and member maps; est-B/block is
// Pool.Stats().ExactStateBytes / n, the pool's own estimate.
func BenchmarkPoolExactState(b *testing.B) {
	const n = poolExpected
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	for _, impl := range []struct {
		name string
		new  func() blockIndex
	}{
		{"pool", func() blockIndex { return newPoolIndex(b) }},
		{"map", func() blockIndex { return newMapIndex() }},
	} {
		b.Run("impl="+impl.name+"/n=1M", func(b *testing.B) {
			prefilled.x, prefilled.w, prefilled.key = nil, nil, ""
			var measured, estimated float64
			for range b.N {
				x, w := impl.new(), newChainWorkload(n)
				before := heap()
				if err := w.fill(x, n); err != nil {
					require.Fail(b, fmt.Sprintf("fill: %v", err))
				}
				after := heap()
				measured = (float64(after) - float64(before)) / n
				if p, ok := x.(*poolIndex); ok {
					st := p.p.Stats()
					if st.UniqueBlocks != n {
						require.Fail(b, fmt.Sprintf("unique blocks %d, want %d", st.UniqueBlocks, n))
					}
					estimated = float64(st.ExactStateBytes) / n
				}
				runtime.KeepAlive(x)
				runtime.KeepAlive(w)
			}
			b.ReportMetric(measured, "B/block")
			if estimated > 0 {
				b.ReportMetric(estimated, "est-B/block")
			}
		})
	}
}

// BenchmarkLocalBlockHash measures the tokens_hash of one block of 16 tokens
// (the relay's default block size) and of 256 tokens.
func BenchmarkLocalBlockHash(b *testing.B) {
	for _, n := range []int{16, 256} {
		tokens := make([]uint32, n)
		for i := range tokens {
			tokens[i] = uint32(benchKey(uint64(i)))
		}
		b.Run(fmt.Sprintf("tokens=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			var sink uint64
			for range b.N {
				sink += ckf.LocalBlockHash(tokens, ckf.BaseSalt)
			}
			sinkU64 = sink
		})
	}
}

// BenchmarkAddress measures addressing alone: Address (fingerprint and both
// buckets, what a consumer probe needs) over keys that differ every call.
func BenchmarkAddress(b *testing.B) {
	ad := ckf.NewAddresser(ckf.DefaultSeed, filterBuckets)
	var sink uint64
	for i := range b.N {
		a := ad.Address(benchKey(uint64(i)))
		sink += a.A ^ a.B ^ uint64(a.Fingerprint)
	}
	sinkU64 = sink
}

// BenchmarkChainHash measures one canonical chain step (SPEC §3).
func BenchmarkChainHash(b *testing.B) {
	var h uint64
	for i := range b.N {
		h = ckf.ChainHash(h, uint64(i))
	}
	sinkU64 = h
}

// batchEvents is an engine batch: the parallel benchmarks apply the pool
// workload in batches of this many events (32 steps, 512 stored blocks).
const batchEvents = 64

// batchIndex collects the workload's events (copies: the workload reuses its
// two events) and applies every batchEvents of them at once: one by one
// through ApplyEvent (serial) or through ApplyEvents.
type batchIndex struct {
	p      *ckf.Pool
	serial bool
	evs    []ckf.RouterEvent
	outs   []ckf.ApplyOutcome
	// took, when not nil, collects each full batch's apply time.
	took   []time.Duration
	blocks [batchEvents][chainBlocks]ckf.StoredBlock
	hashes [batchEvents][chainBlocks]uint64
}

func newBatchIndex(tb testing.TB, workers int, serial bool) *batchIndex {
	cfg := ckf.DefaultConfig()
	cfg.ExpectedBlocks = poolExpected
	cfg.PublishEveryNEvents = poolCadence
	cfg.ApplyWorkers = workers
	p, err := ckf.NewPool(cfg)
	require.NoError(tb, err, "NewPool")
	return &batchIndex{p: p, serial: serial, evs: make([]ckf.RouterEvent, 0, batchEvents)}
}

func (x *batchIndex) apply(ev *ckf.RouterEvent) error {
	i := len(x.evs)
	e := *ev
	e.Blocks = append(x.blocks[i][:0], ev.Blocks...)
	e.BlockHashes = append(x.hashes[i][:0], ev.BlockHashes...)
	x.evs = append(x.evs, e)
	if len(x.evs) < batchEvents {
		return nil
	}
	return x.flush()
}

func (x *batchIndex) flush() error {
	x.outs = x.outs[:0]
	var t0 time.Time
	timed := x.took != nil && len(x.evs) == batchEvents
	if timed {
		t0 = time.Now()
	}
	if x.serial {
		for i := range x.evs {
			x.outs = append(x.outs, x.p.ApplyEvent(&x.evs[i]))
		}
	} else {
		x.outs = x.p.ApplyEvents(x.outs, x.evs)
	}
	if timed {
		x.took = append(x.took, time.Since(t0))
	}
	x.evs = x.evs[:0]
	for _, o := range x.outs {
		if o.FirstError != nil {
			return o.FirstError
		}
	}
	return nil
}

// BenchmarkPoolApplyParallel measures the workload of BenchmarkPoolApplyEvent
// applied in batches of 64 events: impl=serial applies each batch through
// ApplyEvent one by one (the sequential apply, one shard), workers=N through
// ApplyEvents on a pool of N apply workers. Every variant copies the events
// into its batch alike; blocks/s counts stored blocks. p50-ns/op is the
// median batch's apply time per step: on a shared machine another process
// takes a core for milliseconds at a time, which stretches a few batches of
// a few hundred microseconds and leaves the median alone, while it moves
// ns/op (and two goroutines lose more to it than one: each batch needs
// both). p10-ns/op, the fastest decile's, is what the batches cost when no
// other process held a core: the closest a loaded machine comes to a quiet
// one's figure.
func BenchmarkPoolApplyParallel(b *testing.B) {
	for _, load := range []int{50, 90} {
		blocks := poolExpected * load / 100
		for _, impl := range []struct {
			name    string
			workers int
			serial  bool
		}{{"serial", 1, true}, {"workers1", 1, false}, {"workers2", 2, false}, {"workers4", 4, false}} {
			b.Run(fmt.Sprintf("load=%d/impl=%s", load, impl.name), func(b *testing.B) {
				x, w := prefill(b, b.Name(), func() blockIndex { return newBatchIndex(b, impl.workers, impl.serial) }, blocks)
				bx := x.(*batchIndex)
				require.NoError(b, bx.flush(), "prefill tail")
				bx.took = make([]time.Duration, 0, b.N/(batchEvents/2)+1)
				b.ReportAllocs()
				b.ResetTimer()
				cpu0 := processCPU()
				for range b.N {
					if err := w.step(x); err != nil {
						require.Fail(b, fmt.Sprintf("step: %v", err))
					}
				}
				require.NoError(b, bx.flush(), "tail")
				b.StopTimer()
				b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
				b.ReportMetric(float64(b.N*chainBlocks)/b.Elapsed().Seconds(), "blocks/s")
				if len(bx.took) > 0 {
					slices.Sort(bx.took)
					b.ReportMetric(float64(bx.took[len(bx.took)/2])/(batchEvents/2), "p50-ns/op")
					b.ReportMetric(float64(bx.took[len(bx.took)/10])/(batchEvents/2), "p10-ns/op")
				}
				bx.took = nil
				st := bx.p.Stats()
				require.Equal(b, uint64(0), st.CapacityFailures, "capacity failures")
			})
		}
	}
}

// scaleBytes holds the exact-state heap per tracked block measured when a
// scale sub-benchmark filled its pool, by benchmark name.
var scaleBytes = map[string][2]float64{}

// BenchmarkPoolApplyScale measures the relay's apply (ApplyEvents on a pool
// of the relay's default apply workers, ckf.DefaultApplyWorkers: GOMAXPROCS
// capped at 4, so 2 on the 2-core machine; batches of 64 events) of the pool workload's
// step at 1 M, 8 M and 32 M tracked blocks, each pool sized for its blocks
// (ExpectedBlocks = n: 50% slot load), so the cost of a block as the pool
// outgrows the caches shows. B/block is the live heap the fill added (the
// filter, dirty window and workload are allocated before the first
// reading), est-B/block Stats().ExactStateBytes / n. The fill goes through
// the same ApplyEvents; it dominates the run time (tens of seconds at 32 M),
// so benchsummary runs it in one round.
func BenchmarkPoolApplyScale(b *testing.B) {
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	for _, n := range []struct {
		name   string
		blocks int
	}{{"1M", 1 << 20}, {"8M", 8 << 20}, {"32M", 32 << 20}} {
		b.Run("blocks="+n.name, func(b *testing.B) {
			if prefilled.key != b.Name() {
				prefilled.x, prefilled.w, prefilled.key = nil, nil, ""
				cfg := ckf.DefaultConfig()
				cfg.ExpectedBlocks = uint64(n.blocks)
				cfg.PublishEveryNEvents = poolCadence
				cfg.ApplyWorkers = ckf.DefaultApplyWorkers() // as the relay's
				p, err := ckf.NewPool(cfg)
				require.NoError(b, err, "NewPool")
				x := &batchIndex{p: p, evs: make([]ckf.RouterEvent, 0, batchEvents)}
				w := newChainWorkload(n.blocks)
				before := heap()
				require.NoError(b, w.fill(x, n.blocks), "fill")
				require.NoError(b, x.flush(), "fill tail")
				after := heap()
				st := p.Stats()
				require.Equal(b, n.blocks, st.UniqueBlocks, "tracked blocks after the fill")
				scaleBytes[b.Name()] = [2]float64{(float64(after) - float64(before)) / float64(n.blocks), float64(st.ExactStateBytes) / float64(n.blocks)}
				prefilled.key, prefilled.x, prefilled.w = b.Name(), x, w
			}
			x, w := prefilled.x.(*batchIndex), prefilled.w
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := processCPU()
			for range b.N {
				if err := w.step(x); err != nil {
					require.Fail(b, fmt.Sprintf("step: %v", err))
				}
			}
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
			require.NoError(b, x.flush(), "tail")
			b.StopTimer()
			b.ReportMetric(float64(b.N*chainBlocks)/b.Elapsed().Seconds(), "blocks/s")
			b.ReportMetric(scaleBytes[b.Name()][0], "B/block")
			b.ReportMetric(scaleBytes[b.Name()][1], "est-B/block")
		})
	}
}

// BenchmarkPoolApplyTrickle measures what a pool's apply workers cost a
// relay that receives a trickle: one engine batch of 64 events (32 steps of
// the pool workload at 50% load) every 1 ms or 10 ms, applied through
// ApplyEvents with 1 worker, 2, and GOMAXPROCS (run with -cpu to set it). One op is one batch and
// the wait for the next tick. cpu-ms/s is the process CPU per second of
// wall time (the apply, any helper's polling between batches, goroutine
// starts and the ticker's wake-ups), cpu-us/batch the same per batch, and
// idle-cpu-us/batch the part of it spent between one batch's return and
// the next batch (the helpers' lingering, the ticker): what the workers add
// there over 1 worker at the same cadence is the cost of keeping helpers
// (docs/RATIONALE.md "Why is apply_workers GOMAXPROCS by default?").
func BenchmarkPoolApplyTrickle(b *testing.B) {
	for _, every := range []time.Duration{time.Millisecond, 10 * time.Millisecond} {
		for _, workers := range slices.Compact([]int{1, 2, runtime.GOMAXPROCS(0)}) {
			b.Run(fmt.Sprintf("every=%v/workers=%d", every, workers), func(b *testing.B) {
				x, w := prefill(b, fmt.Sprintf("trickle/workers=%d", workers), func() blockIndex { return newBatchIndex(b, workers, false) }, poolExpected/2)
				bx := x.(*batchIndex)
				require.NoError(b, bx.flush(), "prefill tail")
				// The collector off while timed: its marking of the
				// prefilled pool (hundreds of MB) would land in whichever
				// variant's idle time it happened to run.
				runtime.GC()
				defer debug.SetGCPercent(debug.SetGCPercent(-1))
				tick := time.NewTicker(every)
				defer tick.Stop()
				b.ResetTimer()
				cpu0 := processCPU()
				var idle int64
				for range b.N {
					end := processCPU()
					<-tick.C
					idle += processCPU() - end
					for range batchEvents / 2 {
						if err := w.step(x); err != nil {
							require.Fail(b, fmt.Sprintf("step: %v", err))
						}
					}
				}
				end := processCPU()
				<-tick.C // the last batch's helpers have lingered
				idle += processCPU() - end
				b.StopTimer()
				cpu := float64(processCPU() - cpu0)
				b.ReportMetric(cpu/b.Elapsed().Seconds()/1e6, "cpu-ms/s")
				b.ReportMetric(cpu/float64(b.N)/1e3, "cpu-us/batch")
				b.ReportMetric(float64(idle)/float64(b.N)/1e3, "idle-cpu-us/batch")
			})
		}
	}
}
