package replica

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
	"github.com/ckfrelay/ckfrelay/producer"
)

// testNode is one replica process: a Node, the pools it started, and its
// role changes.
type testNode struct {
	n       *Node
	changes chan change
	paused  atomic.Bool
	broken  atomic.Bool
	cancel  context.CancelFunc
	done    chan error

	mu   sync.Mutex
	last *replica // the pool serving now
}

type change struct {
	Status
	at time.Time
}

func (tn *testNode) replica() *replica {
	tn.mu.Lock()
	defer tn.mu.Unlock()
	return tn.last
}

// waitRole waits for the node's next change to role.
func (tn *testNode) waitRole(t *testing.T, role Role, within time.Duration) change {
	t.Helper()
	timeout := time.After(within)
	for {
		select {
		case c := <-tn.changes:
			if c.Role == role {
				return c
			}
		case <-timeout:
			require.Failf(t, "no role change", "node %s did not become %v within %v", tn.n.cfg.Node, role, within)
		}
	}
}

// waitRebuilt waits until the node stands by with a pool it rebuilt after
// it had rebuilt before times (a leader first says it stands by when it
// stops leading, then again once its new pool is built).
func (tn *testNode) waitRebuilt(t *testing.T, before uint64, within time.Duration) change {
	t.Helper()
	timeout := time.After(within)
	for {
		select {
		case c := <-tn.changes:
			if c.Role == RoleStandby && c.Rebuilds > before {
				return c
			}
		case <-timeout:
			require.Failf(t, "no rebuild", "node %s did not rebuild within %v", tn.n.cfg.Node, within)
		}
	}
}

func startNode(t *testing.T, srv *natstest.Server, ls *Leases, id string) *testNode {
	return startNodeWith(t, srv, ls, id, nil, 0)
}

// startNodeWith starts a node that loads and stores checkpoints in cs (nil:
// none), a standby every checkpointRecords records.
func startNodeWith(t *testing.T, srv *natstest.Server, ls *Leases, id string, cs *Checkpoints, checkpointRecords int, opts ...func(*NodeConfig)) *testNode {
	t.Helper()
	_, js := srv.JetStream(t)
	s, err := EnsureStream(t.Context(), js, StreamConfig{Replicas: 1})
	require.NoError(t, err)
	tn := &testNode{changes: make(chan change, 16), done: make(chan error, 1)}
	start := func(img *producer.Image) (Pool, error) {
		r, stop, err := startReplicaImage(64, img)
		if err != nil {
			return Pool{}, err
		}
		tn.mu.Lock()
		tn.last = r
		tn.mu.Unlock()
		return Pool{Handle: r.h, Recorder: r.rec, Close: stop}, nil
	}
	cfg := NodeConfig{
		Pool: "pool", Node: id, Address: "http://" + id, JS: js, Stream: s, Leases: ls,
		MaxMessage:        300, // fragments
		NewPool:           func() (Pool, error) { return start(nil) },
		Checkpoints:       cs,
		PoolFromImage:     start,
		CheckpointRecords: checkpointRecords,
		OnChange:          func(st Status, _ Pool, _ string) { tn.changes <- change{st, time.Now()} },
		renewPaused:       tn.paused.Load,
		clockBroken:       tn.broken.Load,
	}
	for _, o := range opts {
		o(&cfg)
	}
	n, err := NewNode(cfg)
	require.NoError(t, err)
	tn.n = n
	ctx, cancel := context.WithCancel(context.Background())
	tn.cancel = cancel
	go func() { tn.done <- n.Run(ctx) }()
	t.Cleanup(tn.kill)
	return tn
}

// kill stops the node without releasing its lease (a SIGKILL's effect on
// the group: the lease runs out).
func (tn *testNode) kill() {
	if tn.cancel != nil {
		tn.cancel()
		<-tn.done
		tn.cancel = nil
	}
}

// admit stores a chain of n blocks for worker w at epoch 1 on the node's
// pool, each event's parent the previous one's block.
func admit(t *testing.T, r *replica, w uint64, from, n int) {
	t.Helper()
	m := ckf.Member{WorkerID: w}
	for i := from; i < from+n; i++ {
		ev := ckf.RouterEvent{WorkerID: w, EventID: uint64(i), Kind: ckf.EventStored,
			Blocks: []ckf.StoredBlock{{BlockHash: uint64(1000*w) + uint64(i), TokensHash: uint64(i)}}}
		if i > 0 {
			ev.HasParent, ev.ParentHash = true, uint64(1000*w)+uint64(i-1)
		}
		require.NoError(t, r.h.AdmitEvent(t.Context(), 1, ev), "member %v", m)
	}
}

// converged waits until the standby's actor has journalled as many
// commands as the leader's had when asked (it applied every record up to
// there) and returns both states.
func converged(t *testing.T, leader, standby *testNode) (boundary, boundary) {
	t.Helper()
	ctx := t.Context()
	want := leader.replica().at(t, ctx)
	ok := assert.Eventually(t, func() bool {
		return standby.replica().rec.Position() == want.state.JournalPosition
	}, 10*time.Second, 5*time.Millisecond, "the standby did not reach the leader's journal position %d", want.state.JournalPosition)
	if !ok {
		require.Failf(t, "not converged", "leader %+v, standby %+v at journal position %d", leader.n.Status(), standby.n.Status(), standby.replica().rec.Position())
	}
	got := standby.replica().at(t, ctx)
	// Faulted events count on the replica that refused them only.
	want.image, got.image = replicated(want.image), replicated(got.image)
	return want, got
}

// TestNodeTakeover walks the group through its transitions with real
// lease expiry on a real nats-server: a leader and a standby that holds the
// same exact state and words; the leader killed (its lease runs out) and
// the standby leading with everything the old one appended, under a larger
// term; the old one back as a standby that converges; then a leader whose
// renewals stall while it goes on admitting: the standby takes over, the
// stalled leader's appends are refused (or its deadline passes first), it
// steps down, discards its speculative state and converges on the new
// leader's.
func TestNodeTakeover(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := srv.JetStream(t)
	ls, err := OpenLeases(t.Context(), js, LeaseConfig{TTL: time.Second, Replicas: 1})
	require.NoError(t, err)

	a := startNode(t, srv, ls, "a")
	stA := a.waitRole(t, RoleLeader, 10*time.Second)
	b := startNode(t, srv, ls, "b")
	b.waitRole(t, RoleStandby, 10*time.Second)

	admit(t, a.replica(), 1, 0, 40)
	admit(t, a.replica(), 2, 0, 40)
	// Outputs wait for the record: the position after the admissions is
	// acknowledged once an append covers it.
	pos := a.replica().at(t, t.Context()).state.JournalPosition
	wctx, wcancel := context.WithTimeout(t.Context(), 5*time.Second)
	require.NoError(t, a.n.WaitAcked(wctx, pos))
	wcancel()
	want, got := converged(t, a, b)
	require.Equal(t, want, got, "standby state before the kill")
	assert.Equal(t, "a", b.n.Status().Leader)

	// Kill the leader: the standby leads within the TTL plus a takeover.
	start := time.Now()
	a.kill()
	stB := b.waitRole(t, RoleLeader, 5*time.Second)
	t.Logf("takeover after the kill: %v (lease ttl 1s)", time.Since(start))
	assert.Greater(t, stB.Term, stA.Term)
	after := b.replica().at(t, t.Context())
	require.Equal(t, want, after, "the new leader lost or changed state in the takeover")

	// The old node comes back (a fresh process) as a standby and converges.
	a2 := startNode(t, srv, ls, "a")
	a2.waitRole(t, RoleStandby, 10*time.Second)
	admit(t, b.replica(), 3, 0, 30)
	want, got = converged(t, b, a2)
	require.Equal(t, want, got)
	assert.Equal(t, "b", a2.n.Status().Leader)

	// B's renewals stall (its clock is right): it stops leading at its
	// deadline, before anyone else can take the lease (B itself, rebuilt,
	// may win it again).
	b.paused.Store(true)
	down := b.waitRole(t, RoleStandby, 5*time.Second)
	b.paused.Store(false)
	leader, up := waitLeader(t, 5*time.Second, a2, b)
	assert.True(t, down.at.Before(up.at), "the stalled leader stepped down at %v, after the next one led at %v", down.at, up.at)
	assert.Greater(t, up.Term, stB.Term)
	standby := a2
	if leader == a2 {
		standby = b
	}
	want, got = converged(t, leader, standby)
	require.Equal(t, want, got)

	// The leader's renewals stall and its clock lies (it ignores its
	// deadline): only the records chain can fence it. The standby takes
	// over; what the old leader admits now is appended expecting its own
	// last record, refused, never acknowledged; it steps down, discards
	// that pool and converges.
	rebuilds := leader.n.Status().Rebuilds
	leader.paused.Store(true)
	leader.broken.Store(true)
	standby.waitRole(t, RoleLeader, 5*time.Second)
	speculative := leader.replica()
	evs := []ckf.RouterEvent{{WorkerID: 4, EventID: 1, Kind: ckf.EventStored, Blocks: []ckf.StoredBlock{{BlockHash: 4, TokensHash: 4}}}}
	specPos := speculative.rec.Position() + 1
	require.NoError(t, speculative.h.AdmitEvents(t.Context(), 1, evs))
	// What it admitted now is never acknowledged.
	wctx, wcancel = context.WithTimeout(t.Context(), 5*time.Second)
	require.ErrorIs(t, leader.n.WaitAcked(wctx, specPos), ErrNotLeader)
	wcancel()
	leader.waitRebuilt(t, rebuilds, 5*time.Second)
	leader.paused.Store(false)
	leader.broken.Store(false)
	require.NotSame(t, speculative, leader.replica(), "the deposed leader kept its speculative pool")
	admit(t, standby.replica(), 5, 0, 5)
	want, got = converged(t, standby, leader)
	require.Equal(t, want, got, "the deposed leader did not converge on the new leader's state")
	for _, m := range want.state.Members {
		assert.NotEqual(t, uint64(4), m.Lineage.Member.WorkerID, "an unacknowledged event of the deposed leader reached the group")
	}
}

// waitLeader waits for the next change to leader of either node.
func waitLeader(t *testing.T, within time.Duration, x, y *testNode) (*testNode, change) {
	t.Helper()
	timeout := time.After(within)
	for {
		select {
		case c := <-x.changes:
			if c.Role == RoleLeader {
				return x, c
			}
		case c := <-y.changes:
			if c.Role == RoleLeader {
				return y, c
			}
		case <-timeout:
			require.Fail(t, "no leader", "neither node led within %v", within)
		}
	}
}

// TestNodeCorruptRecordHaltsKeepingTheState: a record that does not decode
// (a foreign writer on the records subject, or a bug) halts the chain for
// every standby. A standby keeps the state it applied up to the record
// before — rebuilding would replay the subject to the same record with an
// empty pool, and a foreign message emptied every replica that way — says
// why in its status, and retries with a back-off instead of spinning.
func TestNodeCorruptRecordHaltsKeepingTheState(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := srv.JetStream(t)
	ctx := t.Context()
	ls, err := OpenLeases(ctx, js, LeaseConfig{TTL: time.Minute, Replicas: 1})
	require.NoError(t, err)
	s, err := EnsureStream(ctx, js, StreamConfig{Replicas: 1})
	require.NoError(t, err)
	// Another replica leads (its lease outlives the test) and its chain
	// holds a term record and a batch, then garbage that names the right
	// predecessor.
	_, err = ls.Acquire(ctx, "pool", "other", "")
	require.NoError(t, err)
	subject, _ := Subject("", "pool")
	app := NewAppender(js, s, subject, 1, 0, 0)
	require.NoError(t, app.Term(ctx, TermRecord{Node: "other"}))
	require.NoError(t, app.Append(ctx, 0, []Command{{Kind: KindReset, SourceEpoch: 1, Member: ckf.Member{WorkerID: 7}}}))
	good := app.Last()
	garbage := AppendHeader(nil, Header{Type: TypeBatch, Term: 1, Prev: good})
	garbage = append(garbage, 0, 9, 'z')
	require.NoError(t, app.publish(ctx, "garbage", garbage))

	tn := startNode(t, srv, ls, "victim")
	tn.waitRole(t, RoleStandby, 5*time.Second)
	require.Eventually(t, func() bool { return tn.n.Status().Halts >= 2 }, 5*time.Second, 10*time.Millisecond)
	start, first := time.Now(), tn.n.Status().Halts
	// Poll for a while through the API: the count must grow slowly.
	require.Never(t, func() bool { return tn.n.Status().Halts > first+4 }, 1500*time.Millisecond, 50*time.Millisecond)
	st := tn.n.Status()
	t.Logf("%d halts in %v after the first %d: %s", st.Halts-first, time.Since(start), first, st.Halted)
	assert.Equal(t, RoleStandby, st.Role)
	assert.Zero(t, st.Rebuilds, "the standby threw its state away")
	assert.Equal(t, good, st.Applied, "the standby did not keep what it applied before the bad record")
	assert.Contains(t, st.Halted, "corrupt record")
	img, err := tn.replica().h.ExportState(ctx)
	require.NoError(t, err)
	assert.Len(t, img.Members, 1, "the batch before the bad record is not in the state")
}

// BenchmarkReplication admits 16-block events to a leader as fast as its
// actor takes them and reports how many the group replicated per second
// (a standby applied them) and how long the standby trailed the last
// admission (one embedded nats-server, the leader's appends batched by
// round trip).
func BenchmarkReplication(b *testing.B) {
	srv := natstest.Start(b, natstest.Options{})
	_, js := srv.JetStream(b)
	ls, err := OpenLeases(b.Context(), js, LeaseConfig{TTL: 2 * time.Second, Replicas: 1})
	require.NoError(b, err)
	mk := func(id string) *Node {
		s, err := EnsureStream(b.Context(), js, StreamConfig{Replicas: 1})
		require.NoError(b, err)
		n, err := NewNode(NodeConfig{Pool: "bench", Node: id, JS: js, Stream: s, Leases: ls,
			NewPool: func() (Pool, error) {
				r, stop := startReplica(b, 1<<20)
				return Pool{Handle: r.h, Recorder: r.rec, Close: stop}, nil
			}})
		require.NoError(b, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = n.Run(ctx); close(done) }()
		b.Cleanup(func() { cancel(); <-done })
		return n
	}
	leader := mk("l")
	require.Eventually(b, func() bool { return leader.Status().Role == RoleLeader }, 10*time.Second, time.Millisecond)
	standby := mk("s")
	require.Eventually(b, func() bool { return standby.Status().Term == leader.Status().Term }, 10*time.Second, time.Millisecond)
	h := leader.Pool().Handle
	start := time.Now()
	i := 0
	for b.Loop() {
		ev := ckf.RouterEvent{WorkerID: uint64(i % 64), EventID: uint64(i), Kind: ckf.EventStored}
		for j := range 16 {
			ev.Blocks = append(ev.Blocks, ckf.StoredBlock{BlockHash: uint64(i*16 + j), TokensHash: uint64(i*16 + j)})
		}
		if err := h.AdmitEvent(b.Context(), 1, ev); err != nil {
			require.Fail(b, err.Error())
		}
		i++
	}
	admitted := time.Now()
	_, err = h.ExportState(b.Context())
	require.NoError(b, err)
	pos := leader.Pool().Recorder.Position()
	require.Eventually(b, func() bool { return standby.Pool().Recorder.Position() >= pos }, time.Minute, 100*time.Microsecond)
	lag := time.Since(admitted)
	b.ReportMetric(float64(i)/time.Since(start).Seconds(), "replicated_events/s")
	b.ReportMetric(float64(lag.Microseconds())/1000, "standby_trail_ms")
}

// TestNodeResign: a leader that resigns (a planned stop) deletes its lease
// key, so the standby leads long before the lease's TTL would have run out.
func TestNodeResign(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := srv.JetStream(t)
	const ttl = 10 * time.Second
	ls, err := OpenLeases(t.Context(), js, LeaseConfig{TTL: ttl, Replicas: 1})
	require.NoError(t, err)
	a := startNode(t, srv, ls, "a")
	a.waitRole(t, RoleLeader, 10*time.Second)
	b := startNode(t, srv, ls, "b")
	b.waitRole(t, RoleStandby, 10*time.Second)
	admit(t, a.replica(), 1, 0, 20)
	want, got := converged(t, a, b)
	require.Equal(t, want, got)
	assert.True(t, a.n.Leads(), "the leader leads by its own clock")
	assert.False(t, b.n.Leads(), "a standby does not")

	start := time.Now()
	a.n.Resign()
	require.NoError(t, <-a.done)
	assert.False(t, a.n.Leads(), "a resigned leader does not lead")
	a.cancel()
	a.cancel = nil
	b.waitRole(t, RoleLeader, ttl/2)
	t.Logf("handover after Resign: %v (lease ttl %v)", time.Since(start), ttl)
	require.Equal(t, want, b.replica().at(t, t.Context()))
}

// refusingConsumers is a real JetStream context whose first consumer
// creations fail, as they do while the NATS node that would hold the
// consumer is dead or the stream re-elects its leader.
type refusingConsumers struct {
	jetstream.JetStream
	fails atomic.Int32
}

func (j *refusingConsumers) CreateOrUpdateConsumer(ctx context.Context, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	if j.fails.Add(-1) >= 0 {
		return nil, jetstream.ErrNoStreamResponse
	}
	return j.JetStream.CreateOrUpdateConsumer(ctx, stream, cfg)
}

// TestNodeStandbyKeepsItsPoolWhenFollowingCannotStart: a standby that
// cannot create its records consumer has applied nothing by the attempt,
// so it keeps its pool and tries again — it does not discard the pool and
// replay the subject (with rebuild back-offs growing to 30 s, a standby
// after a NATS node's death could not take over for that long).
func TestNodeStandbyKeepsItsPoolWhenFollowingCannotStart(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := srv.JetStream(t)
	ls, err := OpenLeases(t.Context(), js, LeaseConfig{TTL: time.Second, Replicas: 1})
	require.NoError(t, err)
	a := startNode(t, srv, ls, "a")
	a.waitRole(t, RoleLeader, 10*time.Second)
	admit(t, a.replica(), 1, 0, 20)

	refusing := &refusingConsumers{}
	refusing.fails.Store(3)
	b := startNodeWith(t, srv, ls, "b", nil, 0, func(c *NodeConfig) {
		refusing.JetStream = c.JS
		c.JS = refusing
	})
	b.waitRole(t, RoleStandby, 10*time.Second)
	first := b.replica()
	want, got := converged(t, a, b)
	require.Equal(t, want, got)
	require.LessOrEqual(t, refusing.fails.Load(), int32(0), "the consumer creations never failed")
	assert.Zero(t, b.n.Status().Rebuilds, "the standby rebuilt its pool")
	assert.Same(t, first, b.replica(), "the standby started a new pool")
}
