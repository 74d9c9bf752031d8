package ckf

import (
	"cmp"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// parHistory draws random events for a handful of members from small hash
// spaces, so that events conflict (duplicate and remapped external hashes,
// unknown parents), members share canonical blocks across member shards, and
// small tables run out of room.
type parHistory struct {
	t       *rapid.T
	members []Member
	held    map[Member][]uint64      // external hashes a member stored (maybe since removed)
	stored  map[Member][]RouterEvent // device Stored events per member, for replacements
}

func (g *parHistory) member() Member {
	return rapid.SampledFrom(g.members).Draw(g.t, "member")
}

func (g *parHistory) known(m Member) uint64 {
	if h := g.held[m]; len(h) > 0 && rapid.IntRange(0, 5).Draw(g.t, "knownOrNot") > 0 {
		return rapid.SampledFrom(h).Draw(g.t, "known")
	}
	return rapid.Uint64Range(0, 400).Draw(g.t, "unknown")
}

func (g *parHistory) storedEv(m Member) RouterEvent {
	ev := RouterEvent{WorkerID: m.WorkerID, DPRank: m.DPRank, Kind: EventStored,
		EventID: rapid.Uint64().Draw(g.t, "eventID")}
	switch rapid.IntRange(0, 9).Draw(g.t, "header") {
	case 0, 1, 2, 3:
		ev.HasParent, ev.ParentHash = true, g.known(m)
	case 4:
		ev.HasStartPosition = true
		ev.StartPosition = rapid.Uint32Range(0, 2).Draw(g.t, "start")
	}
	n := rapid.IntRange(0, 24).Draw(g.t, "blocks")
	for range n {
		ev.Blocks = append(ev.Blocks, StoredBlock{
			BlockHash:  rapid.Uint64Range(0, 400).Draw(g.t, "ext"),
			TokensHash: rapid.Uint64Range(0, 40).Draw(g.t, "tokens"),
		})
	}
	for _, b := range ev.Blocks {
		g.held[m] = append(g.held[m], b.BlockHash)
	}
	return ev
}

func (g *parHistory) event() RouterEvent {
	m := g.member()
	switch rapid.IntRange(0, 19).Draw(g.t, "kind") {
	case 0: // cleared (from any tier: it clears the device state)
		return RouterEvent{WorkerID: m.WorkerID, DPRank: m.DPRank, Kind: EventCleared,
			StorageTier: StorageTier(rapid.IntRange(0, 3).Draw(g.t, "clearTier"))}
	case 1: // non-device store or removal: ignored
		ev := g.storedEv(m)
		if rapid.Bool().Draw(g.t, "ignoredRemoval") {
			ev = RouterEvent{WorkerID: m.WorkerID, DPRank: m.DPRank, Kind: EventRemoved, BlockHashes: []uint64{g.known(m)}}
		}
		ev.StorageTier = StorageTier(rapid.IntRange(1, 3).Draw(g.t, "tier"))
		return ev
	case 2: // refused before admission: unknown tier or kind
		if rapid.Bool().Draw(g.t, "badTier") {
			return RouterEvent{WorkerID: m.WorkerID, DPRank: m.DPRank, Kind: EventStored, StorageTier: 4 + StorageTier(rapid.IntRange(0, 9).Draw(g.t, "tier"))}
		}
		return RouterEvent{WorkerID: m.WorkerID, DPRank: m.DPRank, Kind: EventKind(rapid.SampledFrom([]int{0, 4, 200}).Draw(g.t, "badKind"))}
	case 3, 4, 5, 6, 7:
		ev := RouterEvent{WorkerID: m.WorkerID, DPRank: m.DPRank, Kind: EventRemoved}
		for range rapid.IntRange(0, 20).Draw(g.t, "removals") {
			ev.BlockHashes = append(ev.BlockHashes, g.known(m))
		}
		return ev
	default:
		ev := g.storedEv(m)
		g.stored[m] = append(g.stored[m], ev)
		return ev
	}
}

// replacement draws a rank replacement: a prefix of the member's own
// history (valid or not), or nothing (the member's removal).
func (g *parHistory) replacement() []RankReplacement {
	var reps []RankReplacement
	for _, m := range g.members {
		if !rapid.Bool().Draw(g.t, "replace") {
			continue
		}
		h := g.stored[m]
		n := rapid.IntRange(0, len(h)).Draw(g.t, "prefix")
		reps = append(reps, RankReplacement{Member: m, Events: slices.Clone(h[:n])})
	}
	return reps
}

// samePools fails unless got holds exactly want's state: words, RNG,
// lineage, refcounts and residency of every tracked block, statistics.
func samePools(t *rapid.T, step string, want, got *Pool) {
	require.Equal(t, want.t.words, got.t.words, "%s: words", step)
	require.Equal(t, want.t.rng.State(), got.t.rng.State(), "%s: RNG", step)
	require.Equal(t, sortedLineage(want), sortedLineage(got), "%s: lineage", step)
	require.Equal(t, want.MemberCounts(), got.MemberCounts(), "%s: member counts", step)
	require.Equal(t, want.nonResident, got.nonResident, "%s: omitted blocks", step)
	require.Equal(t, want.blockCount(), got.blockCount(), "%s: tracked blocks", step)
	for i := range want.blocks {
		for c, n := range want.blocks[i].all {
			wo, wr := want.Owners(c)
			go_, gr := got.Owners(c)
			require.Equal(t, n, uint64(wo), "%s: owners of %#x", step, c)
			require.Equal(t, [2]any{wo, wr}, [2]any{go_, gr}, "%s: owners and residency of %#x", step, c)
		}
	}
	ws, gs := want.Stats(), got.Stats()
	// The heap estimate sums per-shard maps, so it follows the shard count.
	ws.ExactStateBytes, gs.ExactStateBytes = 0, 0
	require.Equal(t, ws, gs, "%s: stats", step)
	require.Equal(t, want.HasPendingPublication(), got.HasPendingPublication(), "%s: pending publication", step)
}

// sortedLineage is ExportLineage with each member's blocks in external-hash
// order (ExportLineage leaves them in map order).
func sortedLineage(p *Pool) []MemberLineage {
	ls := p.ExportLineage()
	for _, l := range ls {
		slices.SortFunc(l.Blocks, func(a, b LineageEntry) int { return cmp.Compare(a.External, b.External) })
	}
	return ls
}

// schedule is a forced order of ApplyEvents' goroutines for a pool of 2
// workers (parallel.hold): free (whatever the runtime does), solo (the
// helper is held until the call is done: the caller applies alone) or
// helped (the caller waits after publishing each job until the helper has
// taken all its tasks, and after each chunk is ready until the helper has
// taken its owner counts).
type schedule int

const (
	free schedule = iota
	solo
	helped
)

// force installs s on p.
func force(p *Pool, s schedule) {
	par := p.parallelState()
	switch s {
	case solo:
		par.hold = func(at holdPoint) {
			if at != holdHelper {
				return
			}
			for !par.stop.Load() {
				runtime.Gosched()
			}
		}
	case helped:
		par.hold = func(at holdPoint) {
			switch at {
			case holdPublished:
				for jb := par.cur.Load(); jb.done.Load() < jb.n; {
					runtime.Gosched()
				}
			case holdReady:
				ch := par.chunks[par.ready.Load()-1]
				for s := range ch.owners {
					for ch.owners[s].state.Load() == ownersFree {
						runtime.Gosched()
					}
				}
			}
		}
	}
}

// checkSchedule fails unless the last parallel call of p ran as s forces:
// every stage-1 task and every chunk's owner counts taken by the caller
// (solo) or by the helper (helped).
func checkSchedule(t *rapid.T, step string, p *Pool, s schedule) {
	ran := p.par.ran
	require.NotEmpty(t, ran.owners, "%s: no record of the call's schedule", step)
	by := map[schedule]int8{solo: 1, helped: 0}[s]
	for _, g := range ran.members {
		require.Equal(t, by, g, "%s: schedule %d: the goroutine of a stage-1 task", step, s)
	}
	for _, g := range ran.owners {
		require.Equal(t, by, g, "%s: schedule %d: the goroutine of a chunk's owner counts", step, s)
	}
}

// shortLinger is a parallel.linger of a few thousand polls: the real one
// (up to lingerPolls, milliseconds under -race) on the 7 helpers of an
// 8-worker pool would keep the test's cores busy between its batches.
// TestPool_ApplyEventsHelperLeavesWhenIdle and …LingerAdapts use the real
// one.
func shortLinger(st *parallel) func(seen uint64) bool {
	return func(seen uint64) bool {
		for range 4096 {
			if st.calls.Load() != seen {
				return true
			}
		}
		return false
	}
}

// TestPool_ApplyEventsMatchesSequential: random histories — rank
// replacements, resets, flushes and barrier snapshots between batches of
// random size, capacity omissions on small tables, member and tracked-block
// limits that refuse events — applied event by event to one pool and by
// ApplyEvents with 1, 2 and 8 workers to others (every batch through the
// workers, however small; with 2 workers also in the two forced schedules:
// the caller alone, and the helper taking every task and owner count) leave outcomes,
// published batches and state word for word equal after every batch and
// every operation. Run with -race.
func TestPool_ApplyEventsMatchesSequential(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg := DefaultConfig()
		cfg.ExpectedBlocks = rapid.SampledFrom([]uint64{1, 7, 40, 200, 2000}).Draw(t, "expected")
		cfg.MaxKicks = rapid.IntRange(1, 40).Draw(t, "kicks")
		cfg.PublishEveryNEvents = rapid.Uint64Range(1, 7).Draw(t, "every")
		cfg.Seed = rapid.Uint64().Draw(t, "seed")
		cfg.MaxMembers = rapid.SampledFrom([]int{0, 0, 2, 4, 5}).Draw(t, "maxMembers")
		cfg.MaxTrackedBlocks = rapid.SampledFrom([]uint64{0, 0, 10, 60, 300}).Draw(t, "maxTracked")
		seq, err := NewPool(cfg)
		require.NoError(t, err)
		chunk := rapid.IntRange(1, 300).Draw(t, "chunkBlocks")
		workers := []int{1, 2, 8, 2, 2}
		schedules := []schedule{free, free, free, solo, helped}
		pools := make([]*Pool, len(workers))
		for i, w := range workers {
			c := cfg
			c.ApplyWorkers = w
			pools[i], err = NewPool(c)
			require.NoError(t, err)
			pools[i].parallelMin, pools[i].chunkBlocks = 0, chunk
			force(pools[i], schedules[i])
			pools[i].par.linger = shortLinger(pools[i].par)
		}
		g := &parHistory{t: t, held: map[Member][]uint64{}, stored: map[Member][]RouterEvent{}}
		for w := range uint64(3) {
			for r := range uint32(2) {
				g.members = append(g.members, Member{WorkerID: w * 1000003, DPRank: r})
			}
		}
		steps := rapid.IntRange(1, 40).Draw(t, "steps")
		for s := range steps {
			step := fmt.Sprintf("step %d", s)
			switch rapid.IntRange(0, 9).Draw(t, "op") {
			case 0:
				reps := g.replacement()
				wb, werr := seq.ReplaceRanks(reps)
				for i, p := range pools {
					gb, gerr := p.ReplaceRanks(reps)
					require.Equal(t, werr, gerr, "%s workers %d: replacement error", step, workers[i])
					require.Equal(t, wb, gb, "%s workers %d: replacement batch", step, workers[i])
				}
			case 1:
				m := g.member()
				wb, werr := seq.RemoveRank(m)
				for i, p := range pools {
					gb, gerr := p.RemoveRank(m)
					require.Equal(t, werr, gerr, "%s workers %d: reset error", step, workers[i])
					require.Equal(t, wb, gb, "%s workers %d: reset batch", step, workers[i])
				}
			case 2:
				wt, ww := seq.BarrierSnapshot()
				for i, p := range pools {
					gt, gw := p.BarrierSnapshot()
					require.Equal(t, [2]any{wt, ww}, [2]any{gt, gw}, "%s workers %d: barrier snapshot", step, workers[i])
				}
			default:
				evs := make([]RouterEvent, rapid.IntRange(1, 40).Draw(t, "batch"))
				for i := range evs {
					evs[i] = g.event()
				}
				var want []ApplyOutcome
				for i := range evs {
					want = append(want, seq.ApplyEvent(&evs[i]))
				}
				for i, p := range pools {
					forced := schedules[i] != free && p.parallelWorthIt(evs)
					got := p.ApplyEvents(nil, evs)
					require.Equal(t, want, got, "%s workers %d: outcomes of %d events", step, workers[i], len(evs))
					if forced {
						checkSchedule(t, step, p, schedules[i])
					}
				}
			}
			for i, p := range pools {
				samePools(t, fmt.Sprintf("%s workers %d", step, workers[i]), seq, p)
			}
		}
	})
}

// TestPool_ApplyEventsParallelPath: the property test above would pass with
// an ApplyEvents that never used its workers; this one fails unless a
// batch below every bound really goes through stages 1–3 (the workers
// leave their ops behind, which the sequential path never makes).
func TestPool_ApplyEventsParallelPath(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ExpectedBlocks = 1000
	cfg.ApplyWorkers = 2
	p, err := NewPool(cfg)
	require.NoError(t, err)
	evs := []RouterEvent{*rootEv(mA, b(1, 10), b(2, 11)), *rootEv(mB, b(3, 10))}
	p.parallelMin = 0
	outs := p.ApplyEvents(nil, evs)
	require.NotNil(t, p.par, "ApplyEvents with 2 workers did not run the parallel stages")
	require.Len(t, outs, 2)
	owners, resident := p.Owners(chain(10)[0])
	require.Equal(t, uint32(2), owners, "owners of a block two members store in one batch")
	require.True(t, resident)
}

// TestPool_ApplyEventsKeepsBoundedBuffers: a batch of many chunks gets a
// buffer per chunk while it is applied, but the pool keeps at most
// keptChunks of them afterwards (what it retains does not follow the
// largest batch it ever saw), and the next batch still applies exactly.
func TestPool_ApplyEventsKeepsBoundedBuffers(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ExpectedBlocks = 10000
	cfg.ApplyWorkers = 2
	par, err := NewPool(cfg)
	require.NoError(t, err)
	seq, err := NewPool(cfg)
	require.NoError(t, err)
	par.parallelMin, par.chunkBlocks = 0, 2
	batch := func(from uint64, n int) []RouterEvent {
		evs := make([]RouterEvent, n)
		for i := range evs {
			h := from + uint64(i)
			evs[i] = *rootEv(Member{WorkerID: h % 5}, b(h, 1000+h), b(h+1<<32, 2000+h))
		}
		return evs
	}
	for _, evs := range [][]RouterEvent{batch(1, 4*keptChunks), batch(1000, 3)} {
		var want []ApplyOutcome
		for i := range evs {
			want = append(want, seq.ApplyEvent(&evs[i]))
		}
		require.Equal(t, want, par.ApplyEvents(nil, evs), "outcomes of %d events", len(evs))
		require.LessOrEqual(t, len(par.par.chunks), keptChunks, "chunk buffers kept after a batch of %d events", len(evs))
		require.Equal(t, seq.Words(), par.Words(), "words")
	}
}

// lingerPool returns a pool of 2 workers whose every batch goes through the
// stages in several chunks, and batches of n events from 5 members.
func lingerPool(t *testing.T) (par, seq *Pool, batch func(from uint64, n int) []RouterEvent) {
	cfg := DefaultConfig()
	cfg.ExpectedBlocks = 10000
	cfg.ApplyWorkers = 2
	par, err := NewPool(cfg)
	require.NoError(t, err)
	seq, err = NewPool(cfg)
	require.NoError(t, err)
	par.parallelMin, par.chunkBlocks = 0, 4
	batch = func(from uint64, n int) []RouterEvent {
		evs := make([]RouterEvent, n)
		for i := range evs {
			h := from + uint64(i)
			evs[i] = *rootEv(Member{WorkerID: h % 5}, b(h, 1000+h), b(h+1<<32, 2000+h))
		}
		return evs
	}
	return par, seq, batch
}

// applyBoth applies evs to seq event by event and to par through
// ApplyEvents and requires the same outcomes and words.
func applyBoth(t *testing.T, par, seq *Pool, evs []RouterEvent) {
	var want []ApplyOutcome
	for i := range evs {
		want = append(want, seq.ApplyEvent(&evs[i]))
	}
	require.Equal(t, want, par.ApplyEvents(nil, evs), "outcomes of %d events", len(evs))
	require.Equal(t, seq.Words(), par.Words(), "words")
}

// untilCall returns a parallel.linger that holds the helper until a call
// after seen opens (it joins it) or done is closed (it leaves).
func untilCall(st *parallel, done <-chan struct{}) func(seen uint64) bool {
	return func(seen uint64) bool {
		for st.calls.Load() == seen {
			select {
			case <-done:
				return false
			default:
				runtime.Gosched()
			}
		}
		return true
	}
}

// TestPool_ApplyEventsHelperJoinsNextCall: a helper that is still lingering
// after a call takes the next call's work itself: calls in a row start
// one helper goroutine, not one per call. The helper lingers (parallel.linger)
// until the next call has started, however long that takes, and the
// schedule makes the caller wait until the helper took every task, so each
// call is applied by the lingering helper.
func TestPool_ApplyEventsHelperJoinsNextCall(t *testing.T) {
	par, seq, batch := lingerPool(t)
	force(par, helped)
	st := par.par
	done := make(chan struct{})
	defer close(done)
	st.linger = untilCall(st, done)
	for i := range 5 {
		applyBoth(t, par, seq, batch(uint64(100*i), 12))
		require.NotEmpty(t, st.ran.members)
		for _, g := range st.ran.members {
			require.Equal(t, int8(0), g, "call %d: a stage-1 task not taken by the helper", i)
		}
	}
	require.Equal(t, 1, st.started, "helper goroutines started for 5 calls in a row")
}

// TestPool_ApplyEventsHelperLeaveRace: a helper that gave up waiting (it
// cleared alive) while a call started a new helper must return without
// joining: one helper per slot. The first helper leaves as soon as its
// first call is done (parallel.linger) and is held right after it cleared
// alive; a call starts (and is applied by) a new one, which lingers until
// the next call; then the old one is let go: it must return, and the next
// call goes to the new helper. No step depends on how long a helper polls.
func TestPool_ApplyEventsHelperLeaveRace(t *testing.T) {
	par, seq, batch := lingerPool(t)
	force(par, helped)
	st := par.par
	helped := st.hold
	atLeave, gone := make(chan struct{}, 1), make(chan struct{}, 3)
	release, resume := make(chan struct{}), make(chan struct{})
	var leaves, lingers atomic.Int32
	waitCall := untilCall(st, nil)
	st.linger = func(seen uint64) bool {
		switch lingers.Add(1) {
		case 1: // the first helper, after the first call: it leaves
			return false
		case 2: // the second helper, after the second call: held while
			// alive until the old one has returned, then it waits for the
			// third call
			<-resume
			return waitCall(seen)
		}
		return false
	}
	st.hold = func(at holdPoint) {
		switch at {
		case holdLeave:
			if leaves.Add(1) == 1 { // the first helper, alive cleared
				atLeave <- struct{}{}
				<-release
			}
		case holdGone:
			gone <- struct{}{}
		default:
			helped(at)
		}
	}
	applyBoth(t, par, seq, batch(1, 12)) // helper 1 joins, then leaves
	<-atLeave
	applyBoth(t, par, seq, batch(100, 12)) // alive was clear: helper 2
	require.Equal(t, 2, st.started, "helpers started")
	close(release)
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		require.Fail(t, "the old helper did not return while the new one was alive")
	}
	close(resume)
	applyBoth(t, par, seq, batch(200, 12))
	require.Equal(t, 2, st.started, "helpers started")
	for _, g := range st.ran.members {
		require.Equal(t, int8(0), g, "a stage-1 task not taken by the helper")
	}
}

// TestPool_ApplyEventsHelperLeavesWhenIdle: after the last call a helper
// lingers only briefly (lingerPolls, the real bound), then returns: a pool
// that stops applying keeps no goroutine running. The test waits for the
// helper's return through its hold point, not a guess of how long the
// polls take.
func TestPool_ApplyEventsHelperLeavesWhenIdle(t *testing.T) {
	par, seq, batch := lingerPool(t)
	st := par.parallelState()
	gone := make(chan struct{}, 2)
	st.hold = func(at holdPoint) {
		if at == holdGone {
			gone <- struct{}{}
		}
	}
	applyBoth(t, par, seq, batch(1, 12))
	select {
	case <-gone:
	case <-time.After(time.Minute):
		require.Fail(t, "the helper is still running a minute after the last call")
	}
	require.False(t, st.gor[0].alive.Load(), "a helper returned with its slot marked alive")
	applyBoth(t, par, seq, batch(100, 12)) // a new helper for the next call
	require.Equal(t, 2, st.started, "helpers started")
}

// TestPool_ApplyEventsLingerAdapts: a pool fed a trickle stops paying a
// full linger after every call, and one fed a stream gets it back. In a
// synctest bubble (the clock moves only when every goroutine waits): each
// call that comes a millisecond after the helper left shortens the linger
// by a quarter, down to lingerMinPolls; calls that come at once after it
// left double it again, up to lingerPolls. Every call still applies
// exactly.
func TestPool_ApplyEventsLingerAdapts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		par, seq, batch := lingerPool(t)
		st := par.parallelState()
		gone := make(chan struct{}, 1)
		st.hold = func(at holdPoint) {
			if at == holdGone {
				gone <- struct{}{}
			}
		}
		call := 0
		apply := func(gap time.Duration) int64 {
			call++
			applyBoth(t, par, seq, batch(uint64(100*call), 12))
			<-gone // the helper lingered lingerFor polls and returned
			time.Sleep(gap)
			return st.lingerFor.Load()
		}
		require.Equal(t, int64(lingerPolls), apply(time.Millisecond), "the first call's linger")
		want := int64(lingerPolls)
		for want > lingerMinPolls {
			want = max(want-want/4, lingerMinPolls)
			got := apply(time.Millisecond)
			require.Equal(t, want, got, "call %d, a millisecond after the helper left", call)
		}
		require.Equal(t, int64(lingerMinPolls), apply(0), "a trickle's linger stays at the floor")
		for want < lingerPolls {
			want = min(2*want, lingerPolls)
			got := apply(0)
			require.Equal(t, want, got, "call %d, as soon as the helper left", call)
		}
		require.Equal(t, int64(lingerPolls), apply(0), "a stream's linger stays at lingerPolls")
		require.Equal(t, call, st.started, "one helper started per call: each left before the next")
	})
}
