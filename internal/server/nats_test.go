package server

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/client/natsjs"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/internal/source/dynamonats"
	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
	"github.com/ckfrelay/ckfrelay/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// natsTestConfig is testConfig broadcasting through the NATS server at url.
func natsTestConfig(url string, snapshotEvery time.Duration) Config {
	cfg := testConfig()
	cfg.NATS = NATSOut{URL: url, SnapshotInterval: Duration(snapshotEvery)}
	return cfg
}

func startNATSRelay(t *testing.T, cfg Config) *Server {
	t.Helper()
	s, err := New(cfg, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	})
	// Wait for every pool's first snapshot: events admitted before it are
	// in it, not in the stream.
	require.Eventually(t, func() bool {
		for _, st := range s.NATSStats() {
			if st.Snapshots == 0 {
				return false
			}
		}
		return true
	}, 10*time.Second, time.Millisecond)
	return s
}

// natsRouter is a router reading every pool of cfg through NATS at url, one
// lane per pool in configuration order.
type natsRouter struct {
	*client.Router
	stop func()
	logs *lockedBuffer // the router's lane transitions
}

func startNATSRouter(t *testing.T, cfg Config, url string, consumerID uint64) *natsRouter {
	t.Helper()
	return startNATSRouterIn(t, cfg, client.NATSConfig{URL: url}, consumerID)
}

func startNATSRouterIn(t *testing.T, cfg Config, nc client.NATSConfig, consumerID uint64) *natsRouter {
	t.Helper()
	cfg = cfg.WithDefaults()
	domain := cfg.Domain()
	format, err := cfg.Pools[0].Format()
	require.NoError(t, err)
	m := consumer.Manifest{ConsumerInstance: consumerID, Domain: domain, Format: format, VerificationWindow: 2}
	var targets []client.Target
	for i, p := range cfg.Pools {
		m.Lanes[i] = &ckf.PoolID{Domain: domain, DCID: p.DCID}
		targets = append(targets, client.Target{Pool: p.Name, Lane: i})
	}
	lanes, err := client.NewNative(m)
	require.NoError(t, err)
	nc.Options = append(nc.Options, nats.ReconnectWait(50*time.Millisecond))
	logs := &lockedBuffer{}
	r, err := client.New(client.Config{NATS: &nc, Logger: slog.New(slog.NewTextHandler(logs, nil)),
		ConsumerInstance: consumerID, Targets: targets, MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
		IdleTimeout: 2 * time.Second}, lanes)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx)
	}()
	nr := &natsRouter{Router: r, stop: func() { cancel(); <-done }, logs: logs}
	t.Cleanup(nr.stop)
	return nr
}

// hubTable returns the pool's mirror table and sequence (what every
// subscriber is served), taken under a throwaway lease.
func hubTable(s *Server, pool string) (uint64, []uint64, error) {
	sub, err := s.pools[pool].mirror().Subscribe(ckf.LaneLease{ConsumerInstance: 0xA0D17, AssignmentEpoch: auditEpoch.Add(1)})
	if err != nil {
		return 0, nil, err
	}
	defer sub.Cancel()
	snap := sub.Snapshot()
	words := make([]uint64, snap.Identity.Format.BucketCount)
	for off := 0; off < len(words); {
		n, err := sub.ReadSnapshot(off, words[off:])
		if err != nil {
			return 0, nil, err
		}
		off += n
	}
	return snap.Sequence, words, nil
}

var auditEpoch atomic.Uint64

// requireConverged waits until the router's lane holds exactly the relay
// pool's table at the relay's current sequence.
func requireConverged(t *testing.T, s *Server, r *natsRouter, pool string, lane int) {
	t.Helper()
	var last string
	ok := assert.Eventually(t, func() bool {
		seq, want, err := hubTable(s, pool)
		if err != nil {
			last = err.Error()
			return false
		}
		got, gotSeq, err := r.AppendLaneWords(nil, lane)
		if err != nil || gotSeq != seq || !r.Lane(lane).Ready {
			last = fmt.Sprintf("relay at %d, router lane at %d (err %v, %+v)", seq, gotSeq, err, r.Lane(lane))
			return false
		}
		if !slices.Equal(got, want) {
			last = fmt.Sprintf("words differ at sequence %d", seq)
			return false
		}
		return true
	}, 20*time.Second, 5*time.Millisecond)
	require.True(t, ok, "pool %s lane %d did not converge: %s", pool, lane, last)
}

// workload drives random stores, removals and clears into one pool and
// remembers which chains must be found at which depth.
type workload struct {
	rng    *rand.Rand
	p      *hostedPool
	next   uint64
	chains []*chain
}

type chain struct {
	worker uint64
	ext    []uint64 // external block hashes
	seq    []uint64 // canonical sequence hashes
	depth  int      // leading blocks still stored
}

func newWorkload(seed uint64, p *hostedPool) *workload {
	return &workload{rng: rand.New(rand.NewPCG(seed, 7)), p: p, next: seed << 32}
}

func (w *workload) admit(t *testing.T, ev ckf.RouterEvent) {
	t.Helper()
	require.NoError(t, w.p.admit(context.Background(), 1, ev))
}

// step applies one random operation.
func (w *workload) step(t *testing.T) {
	switch op := w.rng.IntN(10); {
	case op < 6 || len(w.chains) == 0: // store a new chain
		n := 1 + w.rng.IntN(8)
		c := &chain{worker: uint64(w.rng.IntN(4)), depth: n}
		locals := make([]uint64, n)
		ev := ckf.RouterEvent{WorkerID: c.worker, Kind: ckf.EventStored}
		for i := range n {
			w.next++
			locals[i] = w.next
			c.ext = append(c.ext, w.next^0xE7)
			ev.Blocks = append(ev.Blocks, ckf.StoredBlock{BlockHash: w.next ^ 0xE7, TokensHash: w.next})
		}
		c.seq = ckf.AppendSequenceHashes(nil, locals)
		w.admit(t, ev)
		w.chains = append(w.chains, c)
	case op < 9: // remove a chain's tail
		c := w.chains[w.rng.IntN(len(w.chains))]
		if c.depth == 0 {
			return
		}
		from := w.rng.IntN(c.depth)
		w.admit(t, ckf.RouterEvent{WorkerID: c.worker, Kind: ckf.EventRemoved, BlockHashes: slices.Clone(c.ext[from:c.depth])})
		c.depth = from
	default: // a worker clears everything
		worker := uint64(w.rng.IntN(4))
		w.admit(t, ckf.RouterEvent{WorkerID: worker, Kind: ckf.EventCleared})
		for _, c := range w.chains {
			if c.worker == worker {
				c.depth = 0
			}
		}
	}
}

// requireNoFalseNegatives checks every stored chain is found at least at its
// depth on the lane (false positives may lengthen it; nothing may shorten it).
func (w *workload) requireNoFalseNegatives(t *testing.T, r *natsRouter, lane int) {
	t.Helper()
	var res consumer.QueryResult
	for _, c := range w.chains {
		require.NoError(t, r.QuerySequenceHashes(c.seq, &res))
		require.GreaterOrEqual(t, int(res.Depths[lane]), c.depth, "chain %+v mask %b fault %q", c, res.Mask, w.p.lastFault)
	}
}

// poolJetStream connects to the NATS server at url (closed when the test
// ends) and returns its JetStream and pool's layout.
func poolJetStream(t *testing.T, url, pool string) (jetstream.JetStream, natsjs.Layout) {
	t.Helper()
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	layout, err := natsjs.For("", pool)
	require.NoError(t, err)
	return js, layout
}

// run applies steps random operations, then flushes.
func (w *workload) run(t *testing.T, steps int) {
	t.Helper()
	for range steps {
		w.step(t)
	}
	w.flush(t)
}

// flush publishes the pool's tail and waits until its hub mirrors it, so
// that a converged router holds every event admitted so far.
func (w *workload) flush(t *testing.T) {
	t.Helper()
	require.NoError(t, w.p.actor().Flush(context.Background()))
	st, err := w.p.actor().Stats(context.Background())
	require.NoError(t, err)
	require.Eventually(t, func() bool { return w.p.mirror().Stats().Sequence >= st.Sequence }, 10*time.Second, time.Millisecond)
}

// TestNATS_EndToEnd: random histories on two pools reach a router through
// JetStream; after every round the router's lanes equal the relay's tables at
// the same sequence and no stored chain is found short.
func TestNATS_EndToEnd(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	cfg := natsTestConfig(ns.URL(), 500*time.Millisecond)
	s := startNATSRelay(t, cfg)
	r := startNATSRouter(t, cfg, ns.URL(), 11)
	loads := []*workload{newWorkload(1, s.pools["dc-a"]), newWorkload(2, s.pools["dc-b"])}
	var resubscribes [2]uint64
	rounds := 12
	if testing.Short() {
		rounds = 4
	}
	for round := range rounds {
		for lane, w := range loads {
			w.run(t, 50)
			requireConverged(t, s, r, cfg.Pools[lane].Name, lane)
			w.requireNoFalseNegatives(t, r, lane)
			if round == 0 {
				resubscribes[lane] = r.Lane(lane).Resubscribes
			}
		}
		if round == rounds/2 {
			// A router that starts late reads the newest snapshot and the
			// stream after it, then follows like the first one.
			late := startNATSRouter(t, cfg, ns.URL(), 12)
			requireConverged(t, s, late, "dc-a", 0)
			requireConverged(t, s, late, "dc-b", 1)
		}
	}
	for lane := range loads {
		assert.Equal(t, resubscribes[lane], r.Lane(lane).Resubscribes, "a healthy broadcast never makes a lane resubscribe: %+v", r.Lane(lane))
	}
	st := s.NATSStats()["dc-a"]
	assert.NotZero(t, st.Deltas)
	assert.NotZero(t, st.Snapshots)
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	assert.Contains(t, rec.Body.String(), fmt.Sprintf(`ckfrelay_nats_deltas_total{pool="dc-a"} %d`, s.NATSStats()["dc-a"].Deltas))
}

// TestNATS_ServerRestart: the NATS server restarts on its file store while
// the relay keeps running; routers re-converge without a relay restart.
func TestNATS_ServerRestart(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	cfg := natsTestConfig(ns.URL(), 200*time.Millisecond)
	s := startNATSRelay(t, cfg)
	r := startNATSRouter(t, cfg, ns.URL(), 11)
	w := newWorkload(3, s.pools["dc-a"])
	w.run(t, 30)
	requireConverged(t, s, r, "dc-a", 0)

	ns.Shutdown()
	w.run(t, 30) // events while NATS is down
	ns.Restart()
	w.run(t, 30)
	requireConverged(t, s, r, "dc-a", 0)
	w.requireNoFalseNegatives(t, r, 0)
	requireConverged(t, s, r, "dc-b", 1)
}

// TestNATS_RelayRestart: a new relay incarnation replaces the snapshot and
// the stream's identity; routers follow it without restarting.
func TestNATS_RelayRestart(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	cfg := natsTestConfig(ns.URL(), time.Second)
	s1 := startNATSRelay(t, cfg)
	r := startNATSRouter(t, cfg, ns.URL(), 11)
	w := newWorkload(4, s1.pools["dc-a"])
	w.run(t, 40)
	requireConverged(t, s1, r, "dc-a", 0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, s1.Shutdown(ctx))

	s2 := startNATSRelay(t, cfg)
	require.NotEqual(t, s1.incarnation, s2.incarnation)
	w2 := newWorkload(5, s2.pools["dc-a"])
	w2.run(t, 40)
	requireConverged(t, s2, r, "dc-a", 0)
	w2.requireNoFalseNegatives(t, r, 0)
	// The old incarnation's chains are gone from the new relay: a lane that
	// kept them would have failed the word comparison above.
}

// TestNATS_DuplicatesAreIgnored: a delta published twice under its message
// id is stored once; one re-delivered without an id (a stale copy) is
// ignored by the consumer; neither makes the lane resubscribe.
func TestNATS_DuplicatesAreIgnored(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	cfg := natsTestConfig(ns.URL(), time.Hour)
	s := startNATSRelay(t, cfg)
	r := startNATSRouter(t, cfg, ns.URL(), 11)
	w := newWorkload(6, s.pools["dc-a"])
	w.run(t, 20)
	requireConverged(t, s, r, "dc-a", 0)

	js, layout := poolJetStream(t, ns.URL(), "dc-a")
	ctx := context.Background()
	st, err := js.Stream(ctx, layout.Stream)
	require.NoError(t, err)
	// Find a delta already delivered and publish it again, with and without
	// its message id.
	var delta *jetstream.RawStreamMsg
	info, err := st.Info(ctx)
	require.NoError(t, err)
	for seq := info.State.LastSeq; seq >= info.State.FirstSeq && delta == nil; seq-- {
		m, err := st.GetMsg(ctx, seq)
		require.NoError(t, err)
		if m.Subject != layout.Subject { // the snapshot pointer
			continue
		}
		var f wire.Frame
		require.NoError(t, wire.DecodeFrame(m.Data, &f))
		if f.Kind == wire.KindDelta {
			delta = m
		}
	}
	require.NotNil(t, delta)
	ack, err := js.Publish(ctx, layout.Subject, delta.Data, jetstream.WithMsgID(delta.Header.Get(nats.MsgIdHdr)))
	require.NoError(t, err)
	assert.True(t, ack.Duplicate, "the same message id within the window is a duplicate")
	_, err = js.Publish(ctx, layout.Subject, delta.Data)
	require.NoError(t, err)

	w.run(t, 20)
	requireConverged(t, s, r, "dc-a", 0)
	assert.Zero(t, r.Lane(0).Resubscribes, "%+v", r.Lane(0))
}

// TestNATS_LateRouterAfterRetentionResnapshots: when the stream no longer
// holds every delta after the newest snapshot (here purged by hand below the
// subject's last message, as age-based retention drops the oldest first), a
// router starting then detects the gap, never applies it, and converges from
// the next snapshot. (A purge of the whole subject breaks the relay's chain:
// it re-snapshots at once, TestNATS_DeletedStreamAndBucketAreRecreated.)
func TestNATS_LateRouterAfterRetentionResnapshots(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	cfg := natsTestConfig(ns.URL(), 2*time.Second)
	s := startNATSRelay(t, cfg)
	w := newWorkload(7, s.pools["dc-a"])
	w.run(t, 20)
	require.Eventually(t, func() bool { return s.NATSStats()["dc-a"].Deltas > 0 }, 10*time.Second, 5*time.Millisecond)
	snapsBefore := s.NATSStats()["dc-a"].Snapshots

	js, layout := poolJetStream(t, ns.URL(), "dc-a")
	st, err := js.Stream(context.Background(), layout.Stream)
	require.NoError(t, err)
	require.NoError(t, st.Purge(context.Background(), jetstream.WithPurgeSubject(layout.Subject), jetstream.WithPurgeKeep(1)))
	w.run(t, 20) // deltas after the hole

	r := startNATSRouter(t, cfg, ns.URL(), 11)
	requireConverged(t, s, r, "dc-a", 0)
	assert.Greater(t, s.NATSStats()["dc-a"].Snapshots, snapsBefore, "convergence needed a newer snapshot")
	li := r.Lane(0)
	assert.NotZero(t, li.Resubscribes, "the gap must have ended a session: %+v", li)
	// A session that ended for the gap (a later one may end otherwise under
	// load, e.g. a snapshot read timing out, so not necessarily the last).
	assert.Contains(t, r.logs.String(), "deactivated", "lane transitions; last error %q", li.LastError)
}

// TestNATS_ExternalServer runs the broadcast through Debian's nats-server
// binary, a separate process.
func TestNATS_ExternalServer(t *testing.T) {
	url := natstest.StartBinary(t)
	cfg := natsTestConfig(url, time.Second)
	s := startNATSRelay(t, cfg)
	r := startNATSRouter(t, cfg, url, 11)
	w := newWorkload(8, s.pools["dc-a"])
	w.run(t, 40)
	requireConverged(t, s, r, "dc-a", 0)
	w.requireNoFalseNegatives(t, r, 0)
}

// TestNATS_TwoRegions: the relay publishes to region A's server; the router
// connects only to region B's, a leaf node of A, and converges and stays
// fresh.
func TestNATS_TwoRegions(t *testing.T) {
	a := natstest.Start(t, natstest.Options{Name: "region-a", LeafListen: true, Domain: "region-a"})
	b := natstest.Start(t, natstest.Options{Name: "region-b", LeafRemote: a.LeafURL(), NoJetStream: true})
	cfg := natsTestConfig(a.URL(), time.Second)
	s := startNATSRelay(t, cfg)
	r := startNATSRouterIn(t, cfg, client.NATSConfig{URL: b.URL(), Domain: "region-a"}, 11)
	w := newWorkload(9, s.pools["dc-a"])
	for range 3 {
		w.run(t, 30)
		requireConverged(t, s, r, "dc-a", 0)
	}
	w.requireNoFalseNegatives(t, r, 0)
	// Fresh: heartbeats keep crossing the leaf link while idle.
	require.Eventually(t, func() bool { return r.Lane(0).Staleness < 200*time.Millisecond && r.Lane(0).Ready },
		5*time.Second, 10*time.Millisecond)
}

// TestNATS_DynamoSourceFeedsAPool: Dynamo envelopes on NATS reach a pool
// through the dynamo source and, through the broadcast, a router.
func TestNATS_DynamoSourceFeedsAPool(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	cfg := natsTestConfig(ns.URL(), time.Second)
	s := startNATSRelay(t, cfg)
	const subject = "namespace.dynamo.component.backend.kv-events"
	src, err := newDynamoSource(SourceSpec{Engine: "dynamo", URL: ns.URL(), Subject: subject}, Config{}.WithDefaults(), 0)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = src.Run(ctx, s.pools["dc-a"].actor()) }()
	t.Cleanup(func() { cancel(); <-done })
	require.Eventually(t, func() bool { return src.Status().State == "live" }, 10*time.Second, time.Millisecond)

	r := startNATSRouter(t, cfg, ns.URL(), 11)
	nc, err := nats.Connect(ns.URL())
	require.NoError(t, err)
	defer nc.Close()
	locals := []uint64{101, 102, 103}
	ev := ckf.RouterEvent{WorkerID: 4, Kind: ckf.EventStored}
	for i, l := range locals {
		ev.Blocks = append(ev.Blocks, ckf.StoredBlock{BlockHash: uint64(900 + i), TokensHash: l})
	}
	msg, err := dynamonats.Encode(dynamonats.Envelope{Topic: "kv-events", PublisherID: 5, Sequence: 0}, []ckf.RouterEvent{ev})
	require.NoError(t, err)
	require.NoError(t, nc.Publish(subject, msg))
	require.NoError(t, nc.Flush())
	seq := ckf.AppendSequenceHashes(nil, locals)
	var res consumer.QueryResult
	require.Eventually(t, func() bool {
		return r.QuerySequenceHashes(seq, &res) == nil && res.Depths[0] == 3
	}, 10*time.Second, time.Millisecond)

	// The engine restarts: a new publisher_id, its sequence from 0, its old
	// blocks gone. The worker is reset; only what the new lifetime stores
	// stays.
	ev2 := ckf.RouterEvent{WorkerID: 4, Kind: ckf.EventStored, Blocks: []ckf.StoredBlock{{BlockHash: 950, TokensHash: 201}}}
	msg, err = dynamonats.Encode(dynamonats.Envelope{Topic: "kv-events", PublisherID: 6, Sequence: 0}, []ckf.RouterEvent{ev2})
	require.NoError(t, err)
	require.NoError(t, nc.Publish(subject, msg))
	require.NoError(t, nc.Flush())
	var res2 consumer.QueryResult
	require.Eventually(t, func() bool {
		return r.QuerySequenceHashes([]uint64{201}, &res2) == nil && res2.Depths[0] == 1 &&
			r.QuerySequenceHashes(seq, &res) == nil && res.Depths[0] == 0
	}, 10*time.Second, time.Millisecond, "old lifetime's chain at depth %d", res.Depths[0])
	assert.EqualValues(t, uint64(1), src.Status().Resets)
	_, err = newDynamoSource(SourceSpec{Engine: "dynamo", URL: ns.URL()}, Config{}.WithDefaults(), 0)
	require.ErrorIs(t, err, ErrInvalidConfig)
}

// TestNATS_DeletedStreamAndBucketAreRecreated: an operator deletes the
// pool's stream and snapshot bucket under a running relay; the relay
// recreates both on its next publish, writes a snapshot naming the new
// stream's sequence, and routers converge again.
func TestNATS_DeletedStreamAndBucketAreRecreated(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	cfg := natsTestConfig(ns.URL(), time.Hour)
	s := startNATSRelay(t, cfg)
	r := startNATSRouter(t, cfg, ns.URL(), 11)
	w := newWorkload(10, s.pools["dc-a"])
	w.run(t, 20)
	requireConverged(t, s, r, "dc-a", 0)

	js, layout := poolJetStream(t, ns.URL(), "dc-a")
	ctx := context.Background()
	require.NoError(t, js.DeleteStream(ctx, layout.Stream))
	require.NoError(t, js.DeleteObjectStore(ctx, layout.Bucket))
	snaps := s.NATSStats()["dc-a"].Snapshots
	w.run(t, 20)
	requireConverged(t, s, r, "dc-a", 0)
	w.requireNoFalseNegatives(t, r, 0)
	assert.Greater(t, s.NATSStats()["dc-a"].Snapshots, snaps, "a new snapshot names the recreated stream")
}

// TestNATS_DeltaOverMaxPayloadBecomesASnapshot: a delta larger than the NATS
// server's max_payload (a mass clear) cannot be published; the relay
// publishes a snapshot covering it instead, and routers converge through the
// gap their consumer detects.
func TestNATS_DeltaOverMaxPayloadBecomesASnapshot(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{MaxPayload: 192 << 10})
	cfg := natsTestConfig(ns.URL(), time.Hour)
	cfg.Pools[0].ExpectedBlocks = 1 << 16
	s := startNATSRelay(t, cfg)
	r := startNATSRouter(t, cfg, ns.URL(), 11)
	p := s.pools["dc-a"]
	var next uint64
	for range 6 { // 24,576 blocks of worker 1
		ev := ckf.RouterEvent{WorkerID: 1, Kind: ckf.EventStored}
		for range 4096 {
			next++
			ev.Blocks = append(ev.Blocks, ckf.StoredBlock{BlockHash: next, TokensHash: next << 20})
		}
		require.NoError(t, p.admit(context.Background(), 1, ev))
	}
	w := newWorkload(11, p)
	w.flush(t)
	requireConverged(t, s, r, "dc-a", 0)
	snaps := s.NATSStats()["dc-a"].Snapshots
	resubs := r.Lane(0).Resubscribes

	require.NoError(t, p.admit(context.Background(), 1, ckf.RouterEvent{WorkerID: 1, Kind: ckf.EventCleared}))
	w.flush(t)
	requireConverged(t, s, r, "dc-a", 0)
	assert.Greater(t, s.NATSStats()["dc-a"].Snapshots, snaps, "the oversize delta went out as a snapshot")
	assert.Zero(t, s.NATSStats()["dc-a"].Resubscribes, "without dropping the relay's hub subscription")
	assert.Greater(t, r.Lane(0).Resubscribes, resubs, "the router re-snapshotted over the gap")
}

// TestNATS_ServerDownAtRelayStart: the relay starts (and serves HTTP) while
// its NATS server is down, and starts broadcasting once it comes up.
func TestNATS_ServerDownAtRelayStart(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	ns.Shutdown()
	cfg := natsTestConfig(ns.URL(), time.Second)
	s, err := New(cfg, slog.New(slog.DiscardHandler))
	require.NoError(t, err, "a NATS server that is down must not stop the relay")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	})
	w := newWorkload(12, s.pools["dc-a"])
	w.run(t, 10)
	assert.Zero(t, s.NATSStats()["dc-a"].Snapshots)
	require.Eventually(t, func() bool { return s.NATSStats()["dc-a"].Retries > 0 }, 30*time.Second, 10*time.Millisecond,
		"an unreachable NATS shows in the retries an operator watches (a setup attempt times out after 10 s)")

	ns.Restart()
	r := startNATSRouter(t, cfg, ns.URL(), 11)
	w.run(t, 10)
	requireConverged(t, s, r, "dc-a", 0)
	w.requireNoFalseNegatives(t, r, 0)
}

// TestHA_FanOutFollowsStreamReplicas: with HA on a three-node cluster and no
// nats.replicas, the fan-out stream and its snapshot bucket are replicated
// as ha.stream_replicas says, like the records stream.
func TestHA_FanOutFollowsStreamReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("a three-node cluster of separate processes")
	}
	nodes := natstest.StartCluster(t, natstest.BuildServer(t), 3)
	url := natstest.URLs(nodes[0], nodes)
	js, layout := poolJetStream(t, url, "dc-a")
	// Right after start a peer may not be placeable yet ("no suitable
	// peers for placement"), and HA needs its streams at start.
	require.Eventually(t, func() bool {
		_, err := js.CreateOrUpdateStream(t.Context(), jetstream.StreamConfig{Name: "PLACEABLE", Replicas: 3})
		return err == nil
	}, 30*time.Second, 200*time.Millisecond, "the cluster does not place R3")
	require.NoError(t, js.DeleteStream(t.Context(), "PLACEABLE"))
	cfg := haConfig(url, "node-a")
	cfg.HA.StreamReplicas = 3
	cfg.NATS = NATSOut{URL: url, SnapshotInterval: Duration(time.Hour)}
	a := startHARelay(t, cfg, nil)
	require.Eventually(t, func() bool {
		st, ok := a.s.NATSStats()["dc-a"]
		return a.leading("dc-a") && ok && st.Snapshots > 0
	}, 60*time.Second, 5*time.Millisecond, "the leader's fan-out never wrote a snapshot")
	for _, name := range []string{layout.Stream, "OBJ_" + layout.Bucket} {
		st, err := js.Stream(t.Context(), name)
		require.NoError(t, err)
		assert.Equal(t, 3, st.CachedInfo().Config.Replicas, name)
		assert.Len(t, st.CachedInfo().Cluster.Replicas, 2, "%s: two followers of its leader", name)
	}
}
