package e2e

import (
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"pgregory.net/rapid"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
)

// drawConfig draws a small relay: three pools on distinct lanes, tiny filters
// with short relocation chains (so capacity omissions happen), per-pool
// cadences, chunked snapshots and either a timer that fires between events or
// one that never does.
func drawConfig(t *rapid.T) rigConfig {
	lanes := rapid.SliceOfNDistinct(rapid.IntRange(0, ckf.MaxLanes-1), 3, 3, rapid.ID[int]).Draw(t, "lanes")
	expected := rapid.SampledFrom([]uint64{4, 8, 16, 32, 64}).Draw(t, "expectedBlocks")
	buckets, _ := ckf.BucketCount(expected)
	return rigConfig{
		Lanes:              lanes,
		Cadence:            rapid.SliceOfN(rapid.Uint64Range(1, 8), 3, 3).Draw(t, "cadence"),
		Members:            rapid.IntRange(2, 4).Draw(t, "members"),
		ExpectedBlocks:     expected,
		Seed:               rapid.SampledFrom([]uint64{ckf.DefaultSeed, 0x123456789ABCDEF0, 7}).Draw(t, "seed"),
		MaxKicks:           rapid.IntRange(1, 64).Draw(t, "maxKicks"),
		ChunkWords:         rapid.IntRange(1, int(buckets)+1).Draw(t, "chunkWords"),
		PublicationDelay:   rapid.SampledFrom([]time.Duration{time.Microsecond, time.Hour}).Draw(t, "publicationDelay"),
		VerificationWindow: rapid.IntRange(1, ckf.MaxVerificationWindow).Draw(t, "verificationWindow"),
		Hostile:            rapid.Bool().Draw(t, "hostile"),
	}
}

// step draws and runs one operation on one pool.
func step(t *rapid.T, r *rig) {
	p := r.pools[rapid.IntRange(0, len(r.pools)-1).Draw(t, "pool")]
	m := p.members[rapid.IntRange(0, len(p.members)-1).Draw(t, "member")]
	held := m.sorted()
	token := func(label string) uint64 { return rapid.Uint64Range(1, 6).Draw(t, label) }
	switch op := rapid.IntRange(0, 99).Draw(t, "op"); {
	case op < 35: // a chain off an earlier block of the member, or a new root
		var parent *block
		if len(held) > 0 && rapid.IntRange(0, 9).Draw(t, "rooted") >= 3 {
			parent = held[rapid.IntRange(0, len(held)-1).Draw(t, "parent")]
		}
		p.storeChain(m, parent, rapid.SliceOfN(rapid.Uint64Range(1, 6), 1, 4).Draw(t, "tokens"))
	case op < 40: // store a held block again (re-offer when not resident)
		if len(held) > 0 {
			if b := held[rapid.IntRange(0, len(held)-1).Draw(t, "restore")]; !b.hasParent || m.held[b.parent] != nil {
				p.restore(m, b)
			}
		}
	case op < 52: // remove known and unknown external hashes
		// Offsets from the member's base name held, removed and never used hashes.
		exts := rapid.SliceOfN(rapid.Uint64Range(0, m.nextExt-m.base+2), 1, 3).Draw(t, "removeOffsets")
		for i := range exts {
			exts[i] += m.base
		}
		if len(held) > 0 && rapid.Bool().Draw(t, "removeHeld") {
			exts = append(exts, held[rapid.IntRange(0, len(held)-1).Draw(t, "removeHeldIndex")].ext)
		}
		p.remove(m, exts)
	case op < 55:
		p.clearMember(m)
	case op < 60: // reset with a growing (or equal, or stale) source epoch
		bump := rapid.IntRange(-1, 2).Draw(t, "resetBump")
		if bump < 0 && m.epoch == 0 {
			bump = 0
		}
		p.reset(m, uint64(int64(m.epoch)+int64(bump)), rapid.Bool().Draw(t, "degraded"))
	case op < 66: // replace one or two members from their own histories
		ms := []*member{m}
		if other := p.members[rapid.IntRange(0, len(p.members)-1).Draw(t, "replaceOther")]; other != m {
			ms = append(ms, other)
		}
		epochs := make([]uint64, len(ms))
		for i, x := range ms {
			epochs[i] = x.epoch + uint64(rapid.IntRange(0, 2).Draw(t, "replaceBump"))
		}
		if x := ms[0]; x.epochKnown && x.epoch > 0 && rapid.IntRange(0, 9).Draw(t, "replaceStale") == 0 {
			epochs[0] = x.epoch - 1
		}
		dropPct := rapid.IntRange(0, 50).Draw(t, "replaceDropPct")
		p.replace(ms, epochs, func(b *block) bool { return int(b.order*2654435761%100) >= dropPct })
	case op < 69:
		if len(p.wantFaults) < 32 { // the fault channel holds 64
			p.storeOrphan(m, token("orphanToken"))
		}
	case op < 71:
		p.storeOtherTier(m, token("hostToken"))
	case op < 74: // an event from an older epoch (dropped) or an unannounced newer one (fault)
		if m.epochKnown && m.epoch > 0 && len(p.wantFaults) < 32 {
			e := m.epoch - 1
			if rapid.Bool().Draw(t, "newerEpoch") {
				e = m.epoch + 1
			}
			p.storeAtEpoch(m, e, token("epochToken"))
		}
	case op < 78:
		p.flush()
	case op < 80: // let the actors idle past the publication delay: the timer publishes sparse tails
		synctest.Wait()
		before := 0
		for _, x := range r.pools {
			before += len(x.sub.Deltas())
		}
		time.Sleep(2 * r.cfg.PublicationDelay)
		synctest.Wait()
		for _, x := range r.pools {
			r.timerDeltas += len(x.sub.Deltas())
		}
		r.timerDeltas -= before
	case op < 90:
		p.pump()
	case op < 92: // lose the next delta in transit
		p.dropNext = true
	case op < 95 && r.hostile != nil: // the hostile stream speaks for this pool
		r.hostile.attack(p, rapid.IntRange(0, 3).Draw(t, "hostileKind"), rapid.Uint64().Draw(t, "hostileWord"))
	default:
		kinds := rapid.SliceOfN(rapid.IntRange(0, 2), len(r.pools), len(r.pools)).Draw(t, "checkpointKinds")
		r.checkpoint(kinds)
	}
}

// TestRelay_EndToEndProperty is the end-to-end property of SPEC §8: random
// event histories through three real producer actors, every frame encoded
// by wire, decoded and applied by one consumer through the router's session
// gate (client.Session). After every checkpoint and every drain marker each
// lane equals its producer's table, and every chain the producer holds
// resident is found at its full depth. Half the runs add a hostile stream
// on a fourth lane that speaks for the pools under their current leases
// (hostile_test.go): each such frame ends its session and changes nothing.
func TestRelay_EndToEndProperty(t *testing.T) {
	maxSteps := 400
	if testing.Short() {
		maxSteps = 150
	}
	var runs, totals [11]int
	rapid.Check(t, func(rt *rapid.T) {
		// A synctest bubble makes a run reproducible: the publication timer
		// fires only when the run idles, and pumps wait for the actors first.
		rapid.SyncTest(rt, func(rt *rapid.T) { runProperty(rt, maxSteps, &runs, &totals) })
	})
	t.Logf("%d runs: %d checkpoints, %d queries, %d fully resident chain checks, %d partially resident, %d restarts, %d recoveries, %d deltas dropped, %d capacity omission events, %d multi-chunk snapshots, %d timer publications, %d hostile frames refused",
		runs[0], totals[0], totals[1], totals[2], totals[3], totals[4], totals[5], totals[6], totals[7], totals[8], totals[9], totals[10])
	// A guard on the generator, not on the relay: a hundred runs that never
	// lose a delta or restart an actor would prove much less than they claim.
	require.False(t, !t.Failed() && runs[0] >= 100 && slices.Contains(totals[2:], 0), "the generator missed a case: %v", totals)
}

func runProperty(rt *rapid.T, maxSteps int, runs, totals *[11]int) {
	r := newRig(rt, drawConfig(rt))
	defer r.close()
	r.settle = synctest.Wait
	steps := rapid.IntRange(1, maxSteps).Draw(rt, "steps")
	for range steps {
		step(rt, r)
	}
	// The end of the run: bring every lane up to date, then shut every
	// actor down; each drain marker must be acknowledged exactly.
	r.checkpoint(make([]int, len(r.pools)))
	for _, p := range r.pools {
		p.shutdown()
	}
	dropped := 0
	for _, p := range r.pools {
		dropped += p.dropped
	}
	runs[0]++
	for i, n := range []int{r.checkpoints, r.queries, r.fullChains, r.partialChains, r.restarts, r.recoveries,
		dropped, r.capacityEvents, r.multiChunkSnapshots, r.timerDeltas, r.hostileFrames} {
		totals[i] += n
	}
}

// scripted returns a deterministic one-pool rig: no timer, cadence 1, a
// table roomy enough for the script, three-word snapshot chunks.
func scripted(t *testing.T) (*rig, *pool, *member) {
	r := newRig(t, rigConfig{
		Lanes: []int{5}, Cadence: []uint64{1}, Members: 2, ExpectedBlocks: 64,
		Seed: ckf.DefaultSeed, MaxKicks: ckf.DefaultMaxKicks, ChunkWords: 3,
		PublicationDelay: time.Hour, VerificationWindow: 2,
	})
	t.Cleanup(r.close)
	return r, r.pools[0], r.pools[0].members[0]
}

func TestRelay_LostDeltaDeactivatesAtTheNextDelta(t *testing.T) {
	r, p, m := scripted(t)
	p.storeChain(m, nil, []uint64{1, 2, 3})
	p.flush()
	p.pump()
	p.dropNext = true
	p.storeChain(m, m.sorted()[2], []uint64{4})
	p.flush()
	p.pump() // lost in transit: the lane is still ready, one delta behind
	st := p.laneStatus()
	require.True(t, st.Ready, "after the loss: lane ready")
	require.Equal(t, p.lastSeq-1, st.InstalledSequence, "after the loss: one delta behind")
	p.storeChain(m, nil, []uint64{5})
	p.flush()
	p.pump()
	want := []consumer.Result{{Outcome: consumer.Deactivated, Fault: consumer.BaseSequenceMismatch, Lane: 5}}
	require.Len(t, p.faultLog, 1, "faults")
	require.Equal(t, want[0].Outcome, p.faultLog[0].Outcome, "fault outcome")
	require.Equal(t, want[0].Fault, p.faultLog[0].Fault, "fault")
	require.Equal(t, uint16(0), r.cons.ReadyMask(), "ready mask %#x after the gap, want 0", r.cons.ReadyMask())
	epoch := p.lease.AssignmentEpoch
	r.checkpoint([]int{0}) // recovers with a new epoch and a snapshot, then checks every chain
	require.Equal(t, epoch+1, p.lease.AssignmentEpoch, "a new lease epoch")
	require.Equal(t, 1, r.recoveries, "recoveries")
	p.shutdown()
}

func TestRelay_LostDeltaOnAnIdleStreamDeactivatesAtTheHeartbeat(t *testing.T) {
	r, p, m := scripted(t)
	p.storeChain(m, nil, []uint64{1, 2})
	p.dropNext = true
	r.checkpoint([]int{0}) // flush, lose the delta, heartbeat detects, new lease recovers
	require.Len(t, p.faultLog, 1, "faults")
	require.Equal(t, consumer.HeartbeatSequenceMismatch, p.faultLog[0].Fault, "fault")
	require.Equal(t, 1, r.recoveries, "recoveries")
	p.shutdown()
}

func TestRelay_LostFinalDeltaFailsTheDrainMarker(t *testing.T) {
	r, p, m := scripted(t)
	p.storeChain(m, nil, []uint64{1, 2})
	p.flush()
	p.pump()
	p.dropNext = true
	p.storeChain(m, nil, []uint64{3})
	p.restart() // shutdown: the last delta is lost, the drain marker says so
	require.Len(t, p.faultLog, 1, "faults")
	require.Equal(t, consumer.TerminalSequenceMismatch, p.faultLog[0].Fault, "fault")
	require.EqualValues(t, 2, p.incarnation, "the second incarnation installed")
	require.Equal(t, 1, r.recoveries, "recoveries")
	r.checkQueries()
	p.shutdown()
}

func TestRelay_ShutdownDrainMarkerIsAcknowledgedExactly(t *testing.T) {
	r, p, m := scripted(t)
	o := r.pools[0].members[1]
	p.storeChain(m, nil, []uint64{1, 2, 3})
	p.storeChain(o, nil, []uint64{1, 2})
	p.remove(m, []uint64{m.sorted()[0].ext, 999})
	p.flush()
	p.pump()
	r.checkQueries()
	p.storeChain(o, nil, []uint64{6}) // still in the subscription at Shutdown
	p.shutdown()
	st := p.laneStatus()
	require.True(t, st.Ready, "lane ready")
	require.Equal(t, p.lastSeq, st.InstalledSequence, "lane sequence")
	require.Equal(t, uint64(1), st.Stats.DrainsAcknowledged, "drains acknowledged")
	require.Empty(t, p.faultLog, "faults")
}
