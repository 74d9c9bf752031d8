package replica

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
	"github.com/ckfrelay/ckfrelay/producer"
)

// replica is one pool and its actor, journalling into a Recorder.
type replica struct {
	h      producer.Handle
	rec    *Recorder
	faults atomic.Int64
}

func poolConfig(expected uint64) ckf.Config {
	cfg := ckf.DefaultConfig()
	cfg.ExpectedBlocks = expected
	// Cadence 1: every command drains its batch, so the actor never arms its
	// publication timer (whose drains would make the leader's dirty window
	// and counters differ from a standby's).
	cfg.PublishEveryNEvents = 1
	return cfg
}

func startReplica(t require.TestingT, expected uint64) (*replica, func()) {
	r, stop, err := startReplicaImage(expected, nil)
	require.NoError(t, err)
	return r, stop
}

// startReplicaImage starts a replica from img (nil: empty). It returns the
// actor's refusal (a node's pool start calls it off the test goroutine).
func startReplicaImage(expected uint64, img *producer.Image) (*replica, func(), error) {
	cfg := poolConfig(expected)
	r := &replica{rec: NewRecorder(1 << 16)}
	pcfg := producer.DefaultConfig()
	pcfg.Journal = r.rec
	scope := producer.Scope{ProducerIncarnation: 1, LayoutGeneration: 1}
	var h producer.Handle
	var faults <-chan producer.Fault
	var err error
	if img == nil {
		var pool *ckf.Pool
		if pool, err = ckf.NewPool(cfg); err != nil {
			return nil, nil, err
		}
		h, faults, err = producer.Start(pool, scope, pcfg)
	} else {
		r.rec.setPosition(img.JournalPosition)
		h, faults, err = producer.StartImage(cfg, img, scope, pcfg)
	}
	if err != nil {
		return nil, nil, err
	}
	go func() {
		for range faults {
			r.faults.Add(1)
		}
	}()
	r.h = h
	return r, func() {
		r.rec.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = h.Shutdown(ctx)
	}, nil
}

// boundary is the leader's state at a record boundary: its exact state,
// and its whole image (words, generator, counters, epochs and their idle
// order).
type boundary struct {
	state producer.ExactState
	image producer.Image
}

// at returns the replica's exact state and image after every command sent
// so far: both are answered between commands, after all of them. The
// caller must know that no further command reaches the actor between the
// two (a leader the test stopped admitting to, a standby that has applied
// all of it).
func (r *replica) at(t require.TestingT, ctx context.Context) boundary {
	st, err := r.h.ExportState(ctx)
	require.NoError(t, err)
	// A lineage is a set (external → canonical); its export order is a
	// map's.
	for _, m := range st.Members {
		slices.SortFunc(m.Lineage.Blocks, func(a, b ckf.LineageEntry) int { return cmp.Compare(a.External, b.External) })
	}
	img, err := r.h.ExportImage(ctx)
	require.NoError(t, err)
	return boundary{state: st, image: img}
}

// history drives random commands at a leader: events of a few members with
// mostly current, sometimes stale or unannounced epochs, parents from what
// the member stored, hashes from small ranges (collisions, mapping
// conflicts, a small table's relocations and capacity omissions), resets
// and replacements.
type history struct {
	epochs map[ckf.Member]uint64
	held   map[ckf.Member][]uint64
	nextID uint64
}

func (hs *history) member(t *rapid.T) ckf.Member {
	return ckf.Member{WorkerID: rapid.Uint64Range(1, 3).Draw(t, "worker"), DPRank: rapid.Uint32Range(0, 1).Draw(t, "rank")}
}

func (hs *history) epoch(t *rapid.T, m ckf.Member) uint64 {
	e, ok := hs.epochs[m]
	if !ok {
		e = rapid.Uint64Range(1, 3).Draw(t, "first epoch")
		hs.epochs[m] = e
	}
	switch rapid.IntRange(0, 19).Draw(t, "epoch skew") {
	case 0:
		return e - 1 // stale: dropped
	case 1:
		return e + 1 // unannounced: a fault
	}
	return e
}

func (hs *history) storedEvent(t *rapid.T, m ckf.Member) ckf.RouterEvent {
	hs.nextID++
	ev := ckf.RouterEvent{WorkerID: m.WorkerID, DPRank: m.DPRank, EventID: hs.nextID, Kind: ckf.EventStored}
	if held := hs.held[m]; len(held) > 0 && rapid.Bool().Draw(t, "has parent") {
		ev.HasParent, ev.ParentHash = true, held[rapid.IntRange(0, len(held)-1).Draw(t, "parent")]
	}
	if rapid.IntRange(0, 9).Draw(t, "tier") == 0 {
		ev.StorageTier = ckf.TierHostPinned
	}
	for range rapid.IntRange(1, 5).Draw(t, "blocks") {
		ext := rapid.Uint64Range(1, 40).Draw(t, "ext")
		ev.Blocks = append(ev.Blocks, ckf.StoredBlock{BlockHash: ext, TokensHash: rapid.Uint64Range(1, 30).Draw(t, "tokens")})
		hs.held[m] = append(hs.held[m], ext)
	}
	return ev
}

func (hs *history) event(t *rapid.T, m ckf.Member) ckf.RouterEvent {
	switch rapid.IntRange(0, 9).Draw(t, "event kind") {
	case 0:
		hs.nextID++
		hs.held[m] = nil
		return ckf.RouterEvent{WorkerID: m.WorkerID, DPRank: m.DPRank, EventID: hs.nextID, Kind: ckf.EventCleared}
	case 1, 2, 3:
		hs.nextID++
		ev := ckf.RouterEvent{WorkerID: m.WorkerID, DPRank: m.DPRank, EventID: hs.nextID, Kind: ckf.EventRemoved}
		held := hs.held[m]
		for range rapid.IntRange(1, 4).Draw(t, "removals") {
			if len(held) > 0 && rapid.IntRange(0, 4).Draw(t, "unknown removal") > 0 {
				ev.BlockHashes = append(ev.BlockHashes, held[rapid.IntRange(0, len(held)-1).Draw(t, "removed")])
			} else {
				ev.BlockHashes = append(ev.BlockHashes, rapid.Uint64Range(1, 40).Draw(t, "removed hash"))
			}
		}
		return ev
	}
	return hs.storedEvent(t, m)
}

// TestStandbyEqualsLeaderAtEveryRecord is the property of issue #34: random
// histories applied by a leader, appended to a real JetStream stream in
// random batches (and, with a small message bound, in fragments), and
// replayed by a standby from the stream give equal exact state (members,
// epochs, lineages, journal position) and filter words at every record
// boundary, and the standby never faults.
func TestStandbyEqualsLeaderAtEveryRecord(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := srv.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := EnsureStream(ctx, js, StreamConfig{Replicas: 1})
	require.NoError(t, err)
	iteration := 0
	rapid.Check(t, func(rt *rapid.T) {
		iteration++
		subject, err := Subject("", fmt.Sprintf("p%d", iteration))
		require.NoError(rt, err)
		expected := rapid.SampledFrom([]uint64{16, 64, 1024}).Draw(rt, "expected blocks")
		maxMessage := rapid.SampledFrom([]int{headerMax + 8, 200, DefaultMaxMessage}).Draw(rt, "max message")
		leader, stopLeader := startReplica(rt, expected)
		defer stopLeader()
		leader.rec.SetRecording(true)
		app := NewAppender(js, s, subject, 1, 0, maxMessage)
		require.NoError(rt, app.Term(ctx, TermRecord{Node: "a", Address: "http://a"}))
		boundaries := map[uint64]boundary{}
		cut := func() {
			b := leader.at(rt, ctx)
			pos, cmds := leader.rec.Take()
			if len(cmds) == 0 {
				return
			}
			require.NoError(rt, app.Append(ctx, pos, cmds))
			boundaries[app.Last()] = b
		}
		hs := &history{epochs: map[ckf.Member]uint64{}, held: map[ckf.Member][]uint64{}}
		for range rapid.IntRange(1, 60).Draw(rt, "commands") {
			m := hs.member(rt)
			switch rapid.IntRange(0, 19).Draw(rt, "command") {
			case 0: // reset, sometimes stale (refused, not journalled)
				e := hs.epochs[m] + 1
				if rapid.IntRange(0, 4).Draw(rt, "stale reset") == 0 && e > 1 {
					e -= 2
				} else {
					hs.epochs[m] = e
				}
				_ = leader.h.ResetRank(ctx, e, m, rapid.Bool().Draw(rt, "degraded"))
				hs.held[m] = nil
			case 1: // replacement of one or two ranks
				var reps []producer.RankReplacement
				seen := map[ckf.Member]bool{}
				for range rapid.IntRange(1, 2).Draw(rt, "ranks") {
					rm := hs.member(rt)
					if seen[rm] {
						continue
					}
					seen[rm] = true
					hs.held[rm] = nil
					e := hs.epochs[rm] + uint64(rapid.IntRange(0, 1).Draw(rt, "replacement epoch step"))
					hs.epochs[rm] = max(e, 1)
					rep := producer.RankReplacement{SourceEpoch: max(e, 1), Member: rm}
					for range rapid.IntRange(0, 3).Draw(rt, "replacement events") {
						rep.Events = append(rep.Events, hs.storedEvent(rt, rm))
					}
					reps = append(reps, rep)
				}
				_ = leader.h.ReplaceRanks(ctx, reps)
			case 2, 3, 4:
				cut()
			default:
				epoch := hs.epoch(rt, m)
				evs := []ckf.RouterEvent{hs.event(rt, m)}
				for rapid.IntRange(0, 2).Draw(rt, "more events") == 0 {
					evs = append(evs, hs.event(rt, m))
				}
				switch rapid.IntRange(0, 3).Draw(rt, "cursor") {
				case 0: // a source that tracks its stream
					hs.nextID++
					cur := producer.Cursor{Source: fmt.Sprintf("engine-%d", m.WorkerID), Seq: hs.nextID}
					require.NoError(rt, leader.h.AdmitEventsAt(ctx, epoch, evs, cur))
				case 1: // a batch whose events its source dropped
					hs.nextID++
					cur := producer.Cursor{Source: fmt.Sprintf("engine-%d", m.WorkerID), Seq: hs.nextID}
					require.NoError(rt, leader.h.AdmitEventsAt(ctx, epoch, nil, cur))
				default:
					require.NoError(rt, leader.h.AdmitEvents(ctx, epoch, evs))
				}
			}
		}
		cut()

		standby, stopStandby := startReplica(rt, expected)
		defer stopStandby()
		f, err := Follow(ctx, js, DefaultStream, subject, 0, 0, 0)
		require.NoError(rt, err)
		defer f.Stop()
		rec, err := f.Next(ctx)
		require.NoError(rt, err)
		require.NotNil(rt, rec.Leader)
		require.Equal(rt, TermRecord{Node: "a", Address: "http://a"}, *rec.Leader)
		require.Equal(rt, uint64(1), f.Term())
		// At a random boundary the standby's image becomes a checkpoint
		// (encoded and decoded); a replica restored from it follows the
		// records after it from its own consumer.
		ckptAt := rapid.IntRange(0, len(boundaries)).Draw(rt, "checkpoint boundary")
		var restored *replica
		var rf *Follower
		takeCheckpoint := func(seq uint64) {
			got := standby.at(rt, ctx)
			b := AppendCheckpoint(nil, &Checkpoint{Seq: seq, Term: f.Term(), Leader: *rec.Leader, Image: got.image})
			ck, err := DecodeCheckpoint(b)
			require.NoError(rt, err)
			var stop func()
			restored, stop, err = startReplicaImage(expected, &ck.Image)
			require.NoError(rt, err)
			rt.Cleanup(stop)
			require.Equal(rt, got, restored.at(rt, ctx), "a restored replica at its checkpoint")
			rf, err = Follow(ctx, js, DefaultStream, subject, ck.Seq, ck.Term, 0)
			require.NoError(rt, err)
			rt.Cleanup(rf.Stop)
		}
		if ckptAt == 0 {
			takeCheckpoint(rec.Seq)
		}
		applied := 0
		for range boundaries {
			rec, err := f.Next(ctx)
			require.NoError(rt, err)
			require.NotNil(rt, rec.Batch)
			want, ok := boundaries[rec.Seq]
			require.True(rt, ok, "record ending at stream sequence %d is no boundary the leader cut", rec.Seq)
			require.NoError(rt, Apply(ctx, standby.h, rec.Batch.Commands))
			got := standby.at(rt, ctx)
			require.Equal(rt, want.state, got.state, "exact state at stream sequence %d", rec.Seq)
			require.Equal(rt, replicated(want.image), replicated(got.image), "image (words, generator, counters, epochs) at stream sequence %d", rec.Seq)
			if applied++; restored == nil {
				if applied == ckptAt {
					takeCheckpoint(rec.Seq)
				}
				continue
			}
			rrec, err := rf.Next(ctx)
			require.NoError(rt, err)
			require.Equal(rt, rec.Seq, rrec.Seq)
			require.NoError(rt, Apply(ctx, restored.h, rrec.Batch.Commands))
			require.Equal(rt, got, restored.at(rt, ctx), "the replica restored at boundary %d, at stream sequence %d", ckptAt, rec.Seq)
		}
		require.Equal(rt, app.Last(), f.Applied())
		require.NotNil(rt, restored, "no checkpoint taken")
		require.Zero(rt, standby.faults.Load(), "the standby faulted on a command the leader applied cleanly")
		require.Zero(rt, restored.faults.Load(), "the restored replica faulted on a command the leader applied cleanly")
	})
}

// replicated returns img without the counters of events the leader refused
// as faults (a parent not found, an exact-state bound): a fault is not
// journalled, so only the replica that admitted the event counts it.
func replicated(img producer.Image) producer.Image {
	c := &img.Pool.Counters
	c.ParentNotFound, c.MemberLimitRejections, c.TrackedBlockLimitRejections = 0, 0, 0
	return img
}

// TestAppendFencing: the stream refuses a second writer that expects the
// same predecessor, a retried append comes back as the stored one, and a
// standby reading a chain detects a gap and a batch of a superseded term.
func TestAppendFencing(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := srv.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := EnsureStream(ctx, js, StreamConfig{Replicas: 1})
	require.NoError(t, err)
	subject, _ := Subject("", "fence")
	cmds := []Command{{Kind: KindReset, SourceEpoch: 1, Member: ckf.Member{WorkerID: 1}}}

	old := NewAppender(js, s, subject, 5, 0, 0)
	require.NoError(t, old.Term(ctx, TermRecord{Node: "old"}))
	require.NoError(t, old.Append(ctx, 0, cmds))
	tail, err := Tail(ctx, s, subject)
	require.NoError(t, err)
	require.Equal(t, old.Last(), tail)

	// A retry of the same batch (its ack lost) is deduplicated: same
	// sequence, nothing appended.
	retry := NewAppender(js, s, subject, 5, old.Last()-1, 0)
	retry.nonce = old.nonce // the same appender's retry
	require.NoError(t, retry.Append(ctx, 0, cmds))
	require.Equal(t, old.Last(), retry.Last())

	// A new leader that applied everything takes the next term ...
	next := NewAppender(js, s, subject, 9, tail, 0)
	require.NoError(t, next.Term(ctx, TermRecord{Node: "new"}))
	// ... and the old one's next append, expecting its own last record, is
	// refused: it must step down.
	err = old.Append(ctx, 1, cmds)
	require.ErrorIs(t, err, ErrRefused)
	// So is a candidate that is behind.
	behind := NewAppender(js, s, subject, 10, tail-1, 0)
	require.ErrorIs(t, behind.Term(ctx, TermRecord{Node: "behind"}), ErrRefused)

	// A standby that is behind a purge (records below a checkpoint's
	// sequence are purged) sees the gap instead of skipping it.
	require.NoError(t, s.Purge(ctx, jetstream.WithPurgeSubject(subject), jetstream.WithPurgeSequence(tail+1)))
	f, err := Follow(ctx, js, DefaultStream, subject, 0, 0, 0)
	require.NoError(t, err)
	defer f.Stop()
	_, err = f.Next(ctx)
	var gap *GapError
	require.ErrorAs(t, err, &gap)

	// A batch whose term is not the chain's is refused by the follower.
	other, _ := Subject("", "terms")
	a := NewAppender(js, s, other, 3, 0, 0)
	require.NoError(t, a.Term(ctx, TermRecord{Node: "x"}))
	wrong := NewAppender(js, s, other, 2, a.Last(), 0)
	require.NoError(t, wrong.Append(ctx, 0, cmds))
	f2, err := Follow(ctx, js, DefaultStream, other, 0, 0, 0)
	require.NoError(t, err)
	defer f2.Stop()
	_, err = f2.Next(ctx)
	require.NoError(t, err)
	_, err = f2.Next(ctx)
	var te *TermError
	require.ErrorAs(t, err, &te)
}
