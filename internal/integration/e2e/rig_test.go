package e2e

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/producer"
	"github.com/ckfrelay/ckfrelay/wire"
)

const consumerInstance = 41

var testDomain = ckf.Domain{
	CacheSemantics: ckf.ScopedDigest{Digest: [16]byte{0xe2, 0xe0}, Source: ckf.DigestExplicit},
	RoutingScope:   ckf.ScopedDigest{Digest: [16]byte{0x0e, 0x2e}, Source: ckf.DigestDefaultDerived},
}

// tb is what the rig needs from *testing.T and *rapid.T.
type tb interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	FailNow()
	Logf(format string, args ...any)
}

// rigConfig shapes one end-to-end run.
type rigConfig struct {
	Lanes              []int    // one pool per entry, on that consumer lane
	Cadence            []uint64 // PublishEveryNEvents per pool
	Members            int      // members per pool
	ExpectedBlocks     uint64   // sizes every pool's (shared) format
	Seed               uint64
	MaxKicks           int
	ChunkWords         int           // snapshot words per chunk frame
	PublicationDelay   time.Duration // the actor's sparse-tail timer
	VerificationWindow int
	Hostile            bool // one hostile stream beside the pools (hostile_test.go)
}

func (c rigConfig) String() string {
	return fmt.Sprintf("lanes=%v cadence=%v members=%d expected=%d seed=%#x kicks=%d chunk=%d delay=%v window=%d hostile=%v",
		c.Lanes, c.Cadence, c.Members, c.ExpectedBlocks, c.Seed, c.MaxKicks, c.ChunkWords, c.PublicationDelay, c.VerificationWindow, c.Hostile)
}

// pool is one producer actor, its shadow, its model and its link to the
// consumer lane.
type pool struct {
	r           *rig
	idx         int
	lane        int
	id          ckf.PoolID
	cfg         ckf.Config
	incarnation uint64

	sess   *client.Session // the router's session of the current lease
	h      producer.Handle
	faults <-chan producer.Fault
	sub    *producer.Subscription
	lease  ckf.LaneLease
	shadow *ckf.Pool
	// mirror is the producer's table rebuilt from the subscription itself
	// (snapshot plus deltas as they leave the actor, before any encoding).
	mirror  []uint64
	lastSeq uint64 // sequence of the mirror
	running bool

	members     []*member
	nextEventID uint64

	// What the actor must report, from the model; reset with each new actor.
	wantFaults         []error
	wantStale          uint64
	wantUnknownEvents  uint64
	wantCapacityEvents uint64
	wantDegraded       uint64

	// The link: one byte stream, two writers (deltas and control frames with
	// a roomy limit, snapshot chunks with a small one) and one reader.
	buf   bytes.Buffer
	w     *wire.Writer
	snapW *wire.Writer
	rd    *wire.Reader
	queue []sentFrame

	// The lane as the consumer should see it.
	dropNext    bool // lose the next delta frame in transit
	lost        bool // a delta was lost since the lane's last snapshot
	deactivated bool // the consumer noticed and revoked the lease

	// Log of what happened, for scripted tests and failure messages.
	faultLog []consumer.Result
	dropped  int
}

// rig is one consumer and its pools.
type rig struct {
	t          tb
	ctx        context.Context
	cfg        rigConfig
	format     ckf.Format
	acfg       producer.Config
	cons       *consumer.Consumer
	lanes      consumerLanes // cons as a router sees it
	pools      []*pool
	hostile    *hostile // a stream beside the pools that speaks for them (nil: none)
	chunkLimit int
	order      uint64
	laneMask   uint16
	// settle, when set, waits until every actor has handled what was queued
	// (synctest.Wait inside a bubble), so pumps forward a deterministic set.
	settle func()

	// counters over the run, logged by the property
	checkpoints, queries, fullChains, partialChains, restarts, recoveries int
	capacityEvents, multiChunkSnapshots, timerDeltas                      int
	hostileFrames                                                         int
}

func newRig(t tb, cfg rigConfig) *rig {
	t.Helper()
	r := &rig{t: t, ctx: context.Background(), cfg: cfg}
	base := ckf.DefaultConfig()
	base.ExpectedBlocks = cfg.ExpectedBlocks
	base.Seed = cfg.Seed
	base.MaxKicks = cfg.MaxKicks
	base.VerificationWindow = cfg.VerificationWindow
	f, err := base.Format()
	require.NoError(t, err, "format of %v", cfg)
	r.format = f
	r.acfg = producer.DefaultConfig()
	r.acfg.PublicationDelay = cfg.PublicationDelay
	r.acfg.FaultCapacity = 64
	// Deltas wait in the subscription between pumps; a run never publishes
	// this many between two pumps, so a lag would be a bug, not the test.
	r.acfg.SubscriberBuffer = 4096
	r.acfg.Logger = slog.New(slog.DiscardHandler)
	r.chunkLimit = wire.MaxSnapshotChunkOverhead + 8*cfg.ChunkWords
	n, err := wire.ChunkWords(r.chunkLimit)
	require.NoError(t, err, "ChunkWords(%d)", r.chunkLimit)
	require.Equal(t, cfg.ChunkWords, n, "ChunkWords(%d)", r.chunkLimit)

	m := consumer.Manifest{
		ConsumerInstance:   consumerInstance,
		Domain:             testDomain,
		Format:             f,
		VerificationWindow: cfg.VerificationWindow,
	}
	for i, lane := range cfg.Lanes {
		p := &pool{r: r, idx: i, lane: lane, id: ckf.PoolID{Domain: testDomain, DCID: 1000 + uint64(lane)}}
		p.cfg = base
		p.cfg.PublishEveryNEvents = cfg.Cadence[i]
		id := p.id
		m.Lanes[lane] = &id
		r.laneMask |= 1 << lane
		for k := range cfg.Members {
			p.members = append(p.members, &member{
				id:    ckf.Member{WorkerID: uint64(1 + k/2), DPRank: uint32(k % 2)},
				epoch: 1, held: make(map[uint64]*block), base: uint64(k+1) << 40, nextExt: uint64(k+1) << 40,
			})
		}
		// The delta limit: every image of the table at once, plus headers.
		limit := 512 + wire.ImageBytes*int(f.BucketCount)
		p.w = wire.NewWriter(&p.buf, limit)
		p.snapW = wire.NewWriter(&p.buf, r.chunkLimit)
		p.rd = wire.NewReader(&p.buf, max(limit, r.chunkLimit))
		p.lease = ckf.LaneLease{ConsumerInstance: consumerInstance, PhysicalLane: uint8(lane)}
		r.pools = append(r.pools, p)
	}
	if cfg.Hostile {
		r.hostile = newHostile(r, &m)
	}
	c, err := consumer.New(m)
	require.NoError(t, err, "consumer.New")
	r.cons, r.lanes = c, consumerLanes{c}
	if r.hostile != nil {
		r.hostile.resubscribe()
	}
	for _, p := range r.pools {
		p.start()
		p.resubscribe()
	}
	return r
}

// close fences every actor still running, so a failed run leaks no goroutine.
func (r *rig) close() {
	for _, p := range r.pools {
		if p.running {
			_ = p.h.Fence(r.ctx)
			p.running = false
		}
	}
}

// start builds a fresh pool, its shadow and actor under the next incarnation.
func (p *pool) start() {
	t := p.r.t
	t.Helper()
	pl, err := ckf.NewPool(p.cfg)
	require.NoError(t, err, "pool %d: NewPool", p.idx)
	p.shadow, err = ckf.NewPool(p.cfg)
	require.NoError(t, err, "pool %d: NewPool (shadow)", p.idx)
	p.incarnation++
	scope := producer.Scope{Pool: p.id, ProducerIncarnation: p.incarnation, LayoutGeneration: 1}
	p.h, p.faults, err = producer.Start(pl, scope, p.r.acfg)
	require.NoError(t, err, "pool %d: Start", p.idx)
	p.running = true
	p.sub = nil
	p.wantFaults, p.wantStale, p.wantUnknownEvents, p.wantCapacityEvents, p.wantDegraded = nil, 0, 0, 0, 0
	for _, m := range p.members {
		m.epochKnown = false
	}
}

// shutdown stops the actor gracefully: the stream's tail and a drain marker
// cross the link, and a healthy lane must acknowledge exactly the last
// sequence and hold the producer's final table.
func (p *pool) shutdown() {
	t := p.r.t
	t.Helper()
	require.NoError(t, p.h.Shutdown(p.r.ctx), "pool %d: Shutdown", p.idx)
	p.running = false
	p.forward(p.sub, true)
	err := p.sub.Err()
	require.ErrorIs(t, err, producer.ErrShuttingDown, "pool %d: the stream's end", p.idx)
	require.NotErrorIs(t, err, producer.ErrFenced, "pool %d: a graceful end", p.idx)
	m, ok := p.sub.DrainMarker()
	require.True(t, ok, "pool %d: a drain marker", p.idx)
	require.Equal(t, p.lease, m.Lease, "pool %d: drain marker lease", p.idx)
	require.Equal(t, p.lastSeq, m.ExpectedSequence, "pool %d: drain marker sequence", p.idx)
	f := wire.Frame{Kind: wire.KindDrainMarker, Drain: m}
	require.NoError(t, p.w.WriteFrame(&f), "pool %d: WriteFrame(drain)", p.idx)
	p.queue = append(p.queue, sentFrame{kind: wire.KindDrainMarker, sequence: m.ExpectedSequence})
	lost := p.lost
	p.deliver()
	p.checkFaults(true)
	require.False(t, lost && !p.deactivated, "pool %d: a lost delta went unnoticed past the drain marker", p.idx)
	st := p.laneStatus()
	require.False(t, p.healthy() && st.Stats.DrainsAcknowledged == 0, "pool %d: drain acknowledged but not counted", p.idx)
	p.compare(uint64(p.shadow.Stats().ResidentBlocks))
}

// restart shuts the actor down and starts the pool's next incarnation from
// every member's replayed history (one rebuild), then resubscribes: the
// consumer sees a new identity and installs its snapshot.
func (p *pool) restart() {
	t := p.r.t
	t.Helper()
	p.shutdown()
	epochs := make([]uint64, len(p.members))
	for i, m := range p.members {
		epochs[i] = m.epoch
	}
	p.start()
	p.replace(p.members, epochs, func(*block) bool { return true })
	p.sub = nil
	p.resubscribe()
	p.r.restarts++
}
