package natspub

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/client/natsjs"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/internal/hub"
	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
	"github.com/ckfrelay/ckfrelay/wire"
)

var (
	testDomain = ckf.Domain{
		CacheSemantics: ckf.ScopedDigest{Digest: [16]byte{1}, Source: ckf.DigestExplicit},
		RoutingScope:   ckf.ScopedDigest{Digest: [16]byte{2}, Source: ckf.DigestExplicit},
	}
	testPoolID = ckf.PoolID{Domain: testDomain, DCID: 1}
	testFormat = ckf.NewFormat(ckf.DefaultSeed, 64)
)

// pool is one incarnation's hub, which the test advances by deltas.
type pool struct {
	h  *hub.Hub
	id ckf.ProducerIdentity
	mu sync.Mutex
	sq uint64
}

// newPool returns a hub of incarnation inc holding a table of word base+i.
func newPool(t *testing.T, inc, base uint64) *pool {
	t.Helper()
	h, err := hub.New(hub.DefaultConfig())
	require.NoError(t, err)
	id := ckf.ProducerIdentity{Pool: testPoolID, ProducerIncarnation: inc, LayoutGeneration: 1, Format: testFormat}
	words := make([]uint64, testFormat.BucketCount)
	for i := range words {
		words[i] = base + uint64(i)
	}
	h.Install(ckf.Snapshot{Identity: id, Sequence: 10, Words: words})
	return &pool{h: h, id: id, sq: 10}
}

// step applies one delta that writes bucket sq%64.
func (p *pool) step(t *testing.T) {
	require.NoError(t, p.tryStep())
}

func (p *pool) tryStep() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sq++
	return p.h.Apply(ckf.Delta{Identity: p.id, BaseSequence: p.sq - 1, Sequence: p.sq,
		Images: []ckf.BucketImage{{Bucket: uint32(p.sq % 64), Word: p.id.ProducerIncarnation<<8 | p.sq}}})
}

// table returns the hub's table and sequence.
func (p *pool) table(t *testing.T) (uint64, []uint64) {
	t.Helper()
	sub, err := p.h.Subscribe(ckf.LaneLease{ConsumerInstance: 0xA0D1, AssignmentEpoch: uint64(time.Now().UnixNano())})
	require.NoError(t, err)
	defer sub.Cancel()
	snap := sub.Snapshot()
	words := make([]uint64, snap.Identity.Format.BucketCount)
	for off := 0; off < len(words); {
		n, err := sub.ReadSnapshot(off, words[off:])
		require.NoError(t, err)
		off += n
	}
	return snap.Sequence, words
}

// holdingJS holds a publisher's publishes on chosen subjects, and its
// snapshot object writes, while paused, then sends them once released
// whatever their context says: a message in flight that reaches the stream
// leader late.
type holdingJS struct {
	jetstream.JetStream
	mu      sync.Mutex
	gates   map[string]chan struct{} // by subject, or putGate; closed on release
	entered chan string              // receives what waits
}

const putGate = "object put"

func newHoldingJS(js jetstream.JetStream) *holdingJS {
	return &holdingJS{JetStream: js, gates: map[string]chan struct{}{}, entered: make(chan string, 16)}
}

// pause holds what (a subject or putGate) until release.
func (h *holdingJS) pause(what string) {
	h.mu.Lock()
	h.gates[what] = make(chan struct{})
	h.mu.Unlock()
}

// release sends what was held of what (idempotent).
func (h *holdingJS) release(what string) {
	h.mu.Lock()
	if g := h.gates[what]; g != nil {
		close(g)
	}
	delete(h.gates, what)
	h.mu.Unlock()
}

func (h *holdingJS) releaseAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for what, g := range h.gates {
		close(g)
		delete(h.gates, what)
	}
}

// waitEntered waits until something held is waiting and returns what.
func (h *holdingJS) waitEntered(t *testing.T) string {
	t.Helper()
	select {
	case what := <-h.entered:
		return what
	case <-time.After(20 * time.Second):
		require.Fail(t, "nothing held was sent")
		return ""
	}
}

func (h *holdingJS) hold(what string) (late bool) {
	h.mu.Lock()
	gate := h.gates[what]
	h.mu.Unlock()
	if gate == nil {
		return false
	}
	h.entered <- what
	<-gate
	return true
}

func (h *holdingJS) PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if h.hold(msg.Subject) {
		ctx = context.Background()
	}
	return h.JetStream.PublishMsg(ctx, msg, opts...)
}

func (h *holdingJS) Publish(ctx context.Context, subject string, data []byte, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if h.hold(subject) {
		ctx = context.Background()
	}
	return h.JetStream.Publish(ctx, subject, data, opts...)
}

func (h *holdingJS) CreateOrUpdateObjectStore(ctx context.Context, cfg jetstream.ObjectStoreConfig) (jetstream.ObjectStore, error) {
	obs, err := h.JetStream.CreateOrUpdateObjectStore(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &holdingObjects{ObjectStore: obs, h: h}, nil
}

type holdingObjects struct {
	jetstream.ObjectStore
	h *holdingJS
}

func (o *holdingObjects) Put(ctx context.Context, meta jetstream.ObjectMeta, r io.Reader) (*jetstream.ObjectInfo, error) {
	if o.h.hold(putGate) {
		ctx = context.Background()
	}
	return o.ObjectStore.Put(ctx, meta, r)
}

// run starts p.Run and returns its result channel; the publisher is
// stopped at the end of the test.
func run(t *testing.T, p *Publisher) <-chan error {
	ctx, cancel := context.WithCancel(context.Background())
	done, finished := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(finished)
		done <- p.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-finished
	})
	return done
}

// storedFrames returns the frames on the pool's frames subject in stream
// order with their stream sequences (the pointer subject's messages are not
// frames).
func storedFrames(t *testing.T, js jetstream.JetStream, layout natsjs.Layout) ([]uint64, []wire.Frame) {
	t.Helper()
	st, err := js.Stream(t.Context(), layout.Stream)
	require.NoError(t, err)
	info, err := st.Info(t.Context())
	require.NoError(t, err)
	var seqs []uint64
	var frames []wire.Frame
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
		m, err := st.GetMsg(t.Context(), seq)
		if err != nil {
			continue // deleted
		}
		if m.Subject != layout.Subject {
			require.Equal(t, layout.Pointer, m.Subject, "seq %d", seq)
			continue
		}
		var f wire.Frame
		require.NoError(t, wire.DecodeFrame(m.Data, &f))
		seqs, frames = append(seqs, seq), append(frames, f)
	}
	return seqs, frames
}

func incarnation(f wire.Frame) uint64 {
	switch f.Kind {
	case wire.KindDelta:
		return f.Delta.Identity.ProducerIncarnation
	case wire.KindHeartbeat:
		return f.Heartbeat.Identity.ProducerIncarnation
	}
	return 0
}

// requireChainHead checks that from the first frame of incarnation inc on,
// every frame stored on the subject is inc's: a deposed publisher's frame
// never follows the new one's.
func requireChainHead(t *testing.T, js jetstream.JetStream, layout natsjs.Layout, inc uint64) {
	t.Helper()
	seqs, frames := storedFrames(t, js, layout)
	first := slices.IndexFunc(frames, func(f wire.Frame) bool { return incarnation(f) == inc })
	require.GreaterOrEqual(t, first, 0, "no frame of incarnation %d", inc)
	for i := first; i < len(frames); i++ {
		require.Equal(t, inc, incarnation(frames[i]), "stream seq %d (%v) after the new incarnation's first frame at %d", seqs[i], frames[i].Kind, seqs[first])
	}
}

// startRouter starts a router reading the pool through NATS at url.
func startRouter(t *testing.T, url string) *client.Router {
	t.Helper()
	m := consumer.Manifest{ConsumerInstance: 77, Domain: testDomain, Format: testFormat, VerificationWindow: 2}
	m.Lanes[0] = &testPoolID
	lanes, err := client.NewNative(m)
	require.NoError(t, err)
	r, err := client.New(client.Config{NATS: &client.NATSConfig{URL: url, Options: []nats.Option{nats.ReconnectWait(50 * time.Millisecond)}},
		Logger: slog.New(slog.DiscardHandler), ConsumerInstance: 77, Targets: []client.Target{{Pool: "p", Lane: 0}},
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, IdleTimeout: 2 * time.Second}, lanes)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

// requireRouterHolds waits until the router's lane holds p's table at its
// sequence.
func requireRouterHolds(t *testing.T, r *client.Router, p *pool) {
	t.Helper()
	seq, want := p.table(t)
	var last string
	ok := assert.Eventually(t, func() bool {
		got, gotSeq, err := r.AppendLaneWords(nil, 0)
		li := r.Lane(0)
		if err != nil || !li.Ready || gotSeq != seq || !slices.Equal(got, want) {
			last = "lane at " + li.LastError
			return false
		}
		return true
	}, 20*time.Second, 5*time.Millisecond)
	require.True(t, ok, "the router never held incarnation %d's table at %d: %s", p.id.ProducerIncarnation, seq, last)
}

// servers runs f against a standalone server (which checks a message's
// expectation before its id) and a three-node cluster with R3 (which checks
// the id first, and answers 10164 while a message is in process).
func servers(t *testing.T, f func(t *testing.T, url string, replicas int)) {
	t.Run("standalone", func(t *testing.T) {
		ns := natstest.Start(t, natstest.Options{})
		f(t, ns.URL(), 1)
	})
	t.Run("cluster-R3", func(t *testing.T) {
		if testing.Short() {
			t.Skip("a three-node cluster of separate processes")
		}
		nodes := natstest.StartCluster(t, natstest.BuildServer(t), 3)
		f(t, natstest.URLs(nodes[0], nodes), 3)
	})
}

func connect(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
}

// rivals is a pool taken over by a new incarnation: p1 publishes old (the
// deposed incarnation's hub) while leading says so; cur is the new
// incarnation's hub, whose publisher leads throughout.
type rivals struct {
	old, cur *pool
	leading  atomic.Bool
	p1       *Publisher
	done1    <-chan error
}

// startRivals starts p1 through js with cfg, leading, and waits until
// ready says it has published enough.
func startRivals(t *testing.T, js jetstream.JetStream, cfg Config, ready func(Stats) bool) *rivals {
	t.Helper()
	r := &rivals{old: newPool(t, 1<<32|1, 1000), cur: newPool(t, 2<<32|1, 5000)}
	r.leading.Store(true)
	cfg.Leading = r.leading.Load
	var err error
	r.p1, err = New(js, r.old.h, cfg)
	require.NoError(t, err)
	r.done1 = run(t, r.p1)
	require.Eventually(t, func() bool { return ready(r.p1.Stats()) }, 20*time.Second, time.Millisecond)
	return r
}

// newLeader returns the new incarnation's publisher through js with cfg
// (not running yet).
func (r *rivals) newLeader(t *testing.T, js jetstream.JetStream, cfg Config) *Publisher {
	t.Helper()
	cfg.Leading = func() bool { return true }
	p, err := New(js, r.cur.h, cfg)
	require.NoError(t, err)
	return p
}

// deposed waits until p1 stops by itself and returns why.
func (r *rivals) deposed(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.done1:
		return err
	case <-time.After(20 * time.Second):
		require.FailNow(t, "the deposed publisher went on publishing")
		return nil
	}
}

// Two publishers of two incarnations race on one pool: the deposed one's
// frame, sent before its lease ran out and before the new one started, and
// reaching the stream after the new one's first frames, is refused (not
// stored), its publisher stops with ErrOvertaken, only the new chain grows,
// and a router reads the new incarnation's table.
func TestChain_DeposedPublishersLateFrameIsRefused(t *testing.T) {
	servers(t, func(t *testing.T, url string, replicas int) {
		js := connect(t, url)
		hj := newHoldingJS(js)
		t.Cleanup(hj.releaseAll)
		cfg := Config{Pool: "p", Heartbeat: 10 * time.Millisecond, SnapshotInterval: time.Hour, Replicas: replicas}
		r := startRivals(t, hj, cfg, func(s Stats) bool { return s.Heartbeats >= 3 })
		old, cur, p1 := r.old, r.cur, r.p1

		// p1's next frame is in flight (its lease check passed) until p2
		// has published.
		hj.pause(p1.Layout().Subject)
		old.step(t)
		hj.waitEntered(t)
		p2 := r.newLeader(t, js, cfg)
		run(t, p2)
		require.Eventually(t, func() bool { return p2.Stats().Snapshots >= 1 }, 20*time.Second, time.Millisecond)
		cur.step(t)
		require.Eventually(t, func() bool { return p2.Stats().Deltas >= 1 }, 20*time.Second, time.Millisecond)
		r.leading.Store(false) // p2 leads only once p1's lease ran out
		hj.release(p1.Layout().Subject)

		require.ErrorIs(t, r.deposed(t), ErrOvertaken, "refused by the stream, not by its own lease check")
		assert.Equal(t, uint64(1), p1.Stats().Overtaken)
		for range 5 {
			cur.step(t)
		}
		require.Eventually(t, func() bool { return p2.Stats().Deltas >= 6 }, 20*time.Second, time.Millisecond)
		requireChainHead(t, js, p2.Layout(), cur.id.ProducerIncarnation)
		assert.Zero(t, p2.Stats().Overtaken)
		requireRouterHolds(t, startRouter(t, url), cur)
	})
}

// A new leader whose first frame is refused because a deposed leader's
// late frame took the tail first chains on from the new tail while it
// leads (Config.Leading), and the deposed one publishes nothing after it.
func TestChain_LeaderChainsOnAfterADeposedLeadersLateFrame(t *testing.T) {
	servers(t, func(t *testing.T, url string, replicas int) {
		js := connect(t, url)
		cfg := Config{Pool: "p", Heartbeat: 10 * time.Millisecond, SnapshotInterval: time.Hour, Replicas: replicas}
		r := startRivals(t, js, cfg, func(s Stats) bool { return s.Heartbeats >= 3 })
		cur, p1 := r.cur, r.p1

		// p2 read the tail; its first frame is in flight while p1
		// publishes.
		hj := newHoldingJS(js)
		t.Cleanup(hj.releaseAll)
		p2 := r.newLeader(t, hj, cfg)
		hj.pause(p2.Layout().Subject)
		run(t, p2)
		hj.waitEntered(t)
		n := p1.Stats().Heartbeats
		require.Eventually(t, func() bool { return p1.Stats().Heartbeats >= n+2 }, 20*time.Second, time.Millisecond)
		r.leading.Store(false)
		hj.release(p2.Layout().Subject)

		require.Eventually(t, func() bool { return p2.Stats().Overtaken >= 1 && p2.Stats().Snapshots >= 1 }, 20*time.Second, time.Millisecond)
		err := r.deposed(t)
		require.True(t, errors.Is(err, ErrOvertaken) || errors.Is(err, ErrNotLeading), "%v", err)
		cur.step(t)
		require.Eventually(t, func() bool { return p2.Stats().Deltas >= 1 }, 20*time.Second, time.Millisecond)
		requireChainHead(t, js, p2.Layout(), cur.id.ProducerIncarnation)
		requireRouterHolds(t, startRouter(t, url), cur)
	})
}

// Messages published on the frames subject by someone else (any message
// id, a newer-looking incarnation among them) do not stop a lone relay's
// publisher: it chains on from them, writes a new snapshot, at most one a
// heartbeat interval, and routers converge.
func TestChain_ForeignMessagesAreChainedOver(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	js := connect(t, ns.URL())
	pl := newPool(t, 1<<32, 0)
	p, err := New(js, pl.h, Config{Pool: "p", Heartbeat: 200 * time.Millisecond, SnapshotInterval: time.Hour})
	require.NoError(t, err)
	done := run(t, p)
	require.Eventually(t, func() bool { return p.Stats().Snapshots >= 1 }, 10*time.Second, time.Millisecond)
	r := startRouter(t, ns.URL())
	requireRouterHolds(t, r, pl)

	for i, id := range []string{natsjs.MsgID(^uint64(0), 1, 1), "", "forged"} {
		_, err := js.Publish(t.Context(), p.Layout().Subject, []byte("not a frame"), jetstream.WithMsgID(id))
		require.NoError(t, err)
		pl.step(t)
		require.Eventually(t, func() bool { return p.Stats().Overtaken == uint64(i+1) }, 10*time.Second, time.Millisecond)
	}
	for range 20 {
		pl.step(t)
	}
	requireRouterHolds(t, r, pl)
	st := p.Stats()
	assert.Equal(t, uint64(23), st.Deltas)
	assert.LessOrEqual(t, st.Snapshots, uint64(4), "one snapshot per chain-over at most: %+v", st)
	select {
	case err := <-done:
		require.Fail(t, "the publisher stopped", "%v", err)
	default:
	}
}

// A deposed publisher's snapshot write that passed its lease check before
// the new leader started, and lands after the new leader's snapshot, never
// becomes the snapshot readers load: the object is its own incarnation's,
// and its pointer is refused. A router started afterwards holds the new
// incarnation's table.
func TestSnapshot_DeposedIncarnationIsNeverLoaded(t *testing.T) {
	servers(t, func(t *testing.T, url string, replicas int) {
		js := connect(t, url)
		hj := newHoldingJS(js)
		t.Cleanup(hj.releaseAll)
		cfg := Config{Pool: "p", Heartbeat: time.Hour, SnapshotInterval: 100 * time.Millisecond, Replicas: replicas}
		r := startRivals(t, hj, cfg, func(s Stats) bool { return s.Snapshots >= 2 })
		cur, p1 := r.cur, r.p1

		// p1's next refresh is on its way: the object write, then (with the
		// pointer) the pointer.
		pointer := p1.Layout().Subject[:len(p1.Layout().Subject)-len("frames")] + "snapshot"
		hj.pause(pointer)
		hj.pause(putGate)
		require.Equal(t, putGate, hj.waitEntered(t))
		cfg2 := cfg
		cfg2.SnapshotInterval = time.Hour
		p2 := r.newLeader(t, js, cfg2)
		run(t, p2)
		require.Eventually(t, func() bool { return p2.Stats().Snapshots >= 1 }, 20*time.Second, time.Millisecond)
		snaps := p1.Stats().Snapshots
		hj.release(putGate)
		// The pointer is on its way too (its lease check passed), or, with
		// a single object, the write was the whole refresh.
		require.Eventually(t, func() bool {
			select {
			case what := <-hj.entered:
				require.Equal(t, pointer, what)
				return true
			default:
				return p1.Stats().Snapshots > snaps
			}
		}, 20*time.Second, time.Millisecond)
		r.leading.Store(false)
		hj.releaseAll()

		requireRouterHolds(t, startRouter(t, url), cur)
		require.ErrorIs(t, r.deposed(t), ErrOvertaken)
		st, err := js.Stream(t.Context(), p2.Layout().Stream)
		require.NoError(t, err)
		m, err := st.GetLastMsgForSubject(t.Context(), p2.Layout().Pointer)
		require.NoError(t, err)
		ptr, err := natsjs.ParsePointer(m.Header)
		require.NoError(t, err)
		assert.Equal(t, cur.id.ProducerIncarnation, ptr.Incarnation)
	})
}

// Each incarnation writes its own object, and once its pointer is stored
// the objects of older incarnations (and the single object of relays before
// the pointer) are deleted: the bucket stays bounded.
func TestSnapshot_OlderIncarnationsObjectsAreDeleted(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	_, js := ns.JetStream(t)
	layout, err := natsjs.For("", "p")
	require.NoError(t, err)
	obs, err := js.CreateOrUpdateObjectStore(t.Context(), jetstream.ObjectStoreConfig{Bucket: layout.Bucket})
	require.NoError(t, err)
	_, err = obs.PutString(t.Context(), natsjs.SnapshotObject, "a relay before the pointer")
	require.NoError(t, err)
	_, err = obs.PutString(t.Context(), "unrelated", "left alone")
	require.NoError(t, err)
	for i, inc := range []uint64{3 << 32, 4 << 32, 9 << 32} {
		pl := newPool(t, inc, uint64(i)*100)
		p, err := New(js, pl.h, Config{Pool: "p", Heartbeat: time.Hour, SnapshotInterval: time.Hour})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		want := []string{natsjs.SnapshotObjectName(inc), "unrelated"}
		var names []string
		assert.Eventually(t, func() bool {
			objs, err := obs.List(t.Context())
			require.NoError(t, err)
			names = names[:0]
			for _, o := range objs {
				names = append(names, o.Name)
			}
			slices.Sort(names)
			return slices.Equal(want, names)
		}, 10*time.Second, 5*time.Millisecond, "after incarnation %x", inc)
		assert.Equal(t, want, names)
		cancel()
		<-done
	}
}

// The NATS node leading the replicated frames stream dies while deltas
// flow: the publisher retries through the election (timeouts, no stream
// response, 10164) with the same message ids, is never refused (an
// election is not another publisher), and a router converges.
func TestChain_SurvivesTheStreamLeadersDeath(t *testing.T) {
	if testing.Short() {
		t.Skip("a three-node cluster of separate processes")
	}
	nodes := natstest.StartCluster(t, natstest.BuildServer(t), 3)
	url := natstest.URLs(nodes[0], nodes)
	js := connect(t, url)
	pl := newPool(t, 1<<32, 0)
	p, err := New(js, pl.h, Config{Pool: "p", Heartbeat: 100 * time.Millisecond, SnapshotInterval: 5 * time.Second, Replicas: 3})
	require.NoError(t, err)
	done := run(t, p)
	require.Eventually(t, func() bool { return p.Stats().Snapshots >= 1 }, 30*time.Second, time.Millisecond)
	st, err := js.Stream(t.Context(), p.Layout().Stream)
	require.NoError(t, err)
	leader := st.CachedInfo().Cluster.Leader

	stop, stepped := make(chan struct{}), make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				stepped <- nil
				return
			case <-time.After(time.Millisecond):
				if err := pl.tryStep(); err != nil {
					stepped <- err
					return
				}
			}
		}
	}()
	require.Eventually(t, func() bool { return p.Stats().Deltas >= 200 }, 20*time.Second, time.Millisecond)
	for _, n := range nodes {
		if n.Name == leader {
			n.Kill()
		}
	}
	n := p.Stats().Deltas
	require.Eventually(t, func() bool { return p.Stats().Deltas >= n+200 }, 60*time.Second, time.Millisecond,
		"the publisher did not go on after the stream leader %s died", leader)
	close(stop)
	require.NoError(t, <-stepped)
	requireRouterHolds(t, startRouter(t, url), pl)
	assert.Zero(t, p.Stats().Overtaken, "an election is not another publisher: %+v", p.Stats())
	select {
	case err := <-done:
		require.Fail(t, "the publisher stopped", "%v", err)
	default:
	}
}

// Message ids are predictable and the stream deduplicates across its
// subjects: a message published first under a frame's or the pointer's
// next id (here on the pointer subject, which does not move the frames'
// tail) must not make the publisher take its own message as stored.
func TestChain_AnIDTakenFirstIsNotTakenForStored(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	js := connect(t, ns.URL())
	pl := newPool(t, 1<<32, 0)
	p, err := New(js, pl.h, Config{Pool: "p", Heartbeat: time.Hour, SnapshotInterval: time.Hour})
	require.NoError(t, err)
	run(t, p)
	require.Eventually(t, func() bool { return p.Stats().Snapshots >= 1 }, 10*time.Second, time.Millisecond)
	// The opening heartbeat was message 1, the pointer 2: the delta to
	// sequence 11 will be 3.
	taken := natsjs.MsgID(pl.id.ProducerIncarnation, 11, 3)
	ack, err := js.PublishMsg(t.Context(), &nats.Msg{Subject: p.Layout().Pointer, Header: nats.Header{"x": {"y"}}}, jetstream.WithMsgID(taken))
	require.NoError(t, err)
	require.False(t, ack.Duplicate)
	pl.step(t)
	require.Eventually(t, func() bool { return p.Stats().Deltas >= 1 }, 10*time.Second, time.Millisecond)
	_, frames := storedFrames(t, js, p.Layout())
	require.NotEmpty(t, frames)
	last := frames[len(frames)-1]
	require.Equal(t, wire.KindDelta, last.Kind, "the delta to 11 is stored")
	assert.Equal(t, uint64(11), last.Delta.Sequence)
}

// A message someone else publishes on the pointer subject (docs/deploy.md:
// only the relay may) does not keep new routers from loading: one that does
// not parse, or names an object that does not hold it, is skipped for the
// object of the incarnation whose frames are the stream's tail, and so is
// one naming an older incarnation's object. Routers used to fail every
// load until the relay's next pointer — a snapshot interval, here an hour.
func TestSnapshot_ForgedPointerDoesNotBlockNewRouters(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	js := connect(t, ns.URL())
	pl := newPool(t, 1<<32, 0)
	p, err := New(js, pl.h, Config{Pool: "p", Heartbeat: 50 * time.Millisecond, SnapshotInterval: time.Hour})
	require.NoError(t, err)
	done := run(t, p)
	require.Eventually(t, func() bool { return p.Stats().Snapshots >= 1 }, 10*time.Second, time.Millisecond)
	st, err := js.Stream(t.Context(), p.Layout().Stream)
	require.NoError(t, err)
	m, err := st.GetLastMsgForSubject(t.Context(), p.Layout().Pointer)
	require.NoError(t, err)
	relays, err := natsjs.ParsePointer(m.Header)
	require.NoError(t, err)
	// A deposed incarnation's late object (a publisher's cleaning deletes
	// older incarnations' objects only when its chain starts: it is done),
	// which a pointer can name with every field right.
	p.cleaning.Wait()
	deposed := newPool(t, 1<<31, 9000)
	seq, words := deposed.table(t)
	var buf bytes.Buffer
	require.NoError(t, wire.NewWriter(&buf, snapshotChunkBytes).WriteSnapshot(&ckf.Snapshot{Identity: deposed.id, Sequence: seq, Words: words}))
	stale := natsjs.Pointer{Object: natsjs.SnapshotObjectName(deposed.id.ProducerIncarnation), Incarnation: deposed.id.ProducerIncarnation, Sequence: seq, StreamSequence: 1}
	obs, err := js.ObjectStore(t.Context(), p.Layout().Bucket)
	require.NoError(t, err)
	_, err = obs.Put(t.Context(), jetstream.ObjectMeta{Name: stale.Object, Metadata: map[string]string{natsjs.MetaSequence: strconv.FormatUint(seq, 10),
		natsjs.MetaIncarnation: strconv.FormatUint(stale.Incarnation, 10), natsjs.MetaStreamSequence: "1"}}, &buf)
	require.NoError(t, err)

	for _, forged := range []struct {
		name   string
		header nats.Header
	}{
		{"no pointer headers", nats.Header{"x": {"y"}}},
		{"an object that does not exist", natsjs.Pointer{Object: natsjs.SnapshotObjectName(77), Incarnation: 77, Sequence: 1, StreamSequence: 1}.Header()},
		{"the relay's object with other fields", natsjs.Pointer{Object: relays.Object, Incarnation: relays.Incarnation, Sequence: relays.Sequence + 100, StreamSequence: 1}.Header()},
		{"a deposed incarnation's object", stale.Header()},
	} {
		t.Run(forged.name, func(t *testing.T) {
			pl.step(t)
			_, err := js.PublishMsg(t.Context(), &nats.Msg{Subject: p.Layout().Pointer, Header: forged.header})
			require.NoError(t, err)
			start := time.Now()
			requireRouterHolds(t, startRouter(t, ns.URL()), pl)
			t.Logf("a new router held the table %v after the forged pointer", time.Since(start))
		})
	}
	assert.Equal(t, uint64(1), p.Stats().Snapshots, "the relay wrote no new pointer meanwhile")
	select {
	case err := <-done:
		require.Fail(t, "the publisher stopped", "%v", err)
	default:
	}
}
