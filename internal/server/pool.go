package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/hub"
	"github.com/ckfrelay/ckfrelay/internal/persist"
	"github.com/ckfrelay/ckfrelay/internal/replica"
	"github.com/ckfrelay/ckfrelay/internal/source"
	"github.com/ckfrelay/ckfrelay/internal/source/dynamonats"
	"github.com/ckfrelay/ckfrelay/producer"
)

// hubConsumer is the consumer instance the relay's own hub uses for its one
// lease on each pool's publisher.
const hubConsumer uint64 = 0xC0FFEE

// layoutGeneration is every pool's ProducerIdentity.layout_generation: the
// layout (format: seed, bucket count) of the pool's table within one producer
// incarnation, counted from 1. A relay never changes a pool's layout while it
// runs (a new format takes a restart, which is a new incarnation), so every
// key it publishes is its incarnation's first layout. 0 is not a generation:
// Dynamo refuses it as malformed (docs/RATIONALE.md "Why is every
// layout_generation 1?").
const layoutGeneration = 1

// hubFeedBuffer is the delta buffer of the hub's own lease. The hub drains
// it at memory speed into its shared log, so it need not match the log.
const hubFeedBuffer = 4096

// Causes a hub is closed with; the stream handler maps them to close reasons.
var (
	errShuttingDown = errors.New("server: shutting down")
	errFenced       = errors.New("server: pool fenced")
	// errDeposed: the replica stopped leading its pool (ha.go).
	errDeposed = errors.New("server: this replica no longer leads the pool")
)

// hostedPool is one pool: the actor and hub serving it now (its current
// generation), and what outlives a generation — its spec, journal and
// fault record. Without HA a pool has one generation for the relay's life;
// with HA (ha.go) each rebuild from the records stream is a new actor, and
// each leadership term a new hub.
type hostedPool struct {
	spec PoolSpec
	log  *slog.Logger
	// journal keeps the exact state on disk; nil without a data dir.
	journal *persist.PoolLog
	m       *metrics
	ha      *haPool // nil without HA

	cur atomic.Pointer[poolGen]

	// admit admits into the current generation's actor; tests replace it
	// to fail part way.
	admit func(ctx context.Context, sourceEpoch uint64, ev ckf.RouterEvent) error

	mu        sync.Mutex
	hubEpoch  uint64
	lastFault string
}

// poolGen is one actor of a pool and the hub that mirrors it. It is never
// changed once published in hostedPool.cur: a role change publishes a new
// one.
type poolGen struct {
	handle producer.Handle
	hub    *hub.Hub
	// rec is the replicated pool's journal (nil without HA); leading is
	// whether this generation's node leads (always true without HA): only
	// a leading generation admits and serves streams.
	rec     *replica.Recorder
	leading bool
	term    uint64

	feederDone chan struct{}
	faultsDone chan struct{}
}

// gen returns the pool's current generation.
func (p *hostedPool) gen() *poolGen { return p.cur.Load() }

// actor returns the current generation's actor handle.
func (p *hostedPool) actor() producer.Handle { return p.gen().handle }

// mirror returns the current generation's hub (a closed one while a
// standby: it serves nothing).
func (p *hostedPool) mirror() *hub.Hub { return p.gen().hub }

func startPool(spec PoolSpec, cfg Config, domain ckf.Domain, incarnation uint64, log *slog.Logger, m *metrics, store *persist.Store) (*hostedPool, error) {
	var journal *persist.PoolLog
	var recovered persist.Recovered
	if store != nil {
		journal = store.Pool(spec.Name, persist.Options{Logger: log})
		var err error
		if recovered, err = journal.Load(); err != nil {
			return nil, err
		}
	}
	p := newHostedPool(spec, log, m)
	p.journal = journal
	var j producer.Journal
	if journal != nil {
		j = journal
	}
	g, err := p.startActor(cfg, domain, incarnation, j, nil)
	if err != nil {
		return nil, err
	}
	if g.hub, err = newHub(cfg); err != nil {
		_ = g.handle.Fence(context.Background())
		return nil, err
	}
	g.leading, g.feederDone = true, make(chan struct{})
	p.cur.Store(g)
	if journal != nil {
		// Replay what the last run admitted before anyone can subscribe:
		// the recovered state is published as this incarnation's.
		if err := journal.Restore(context.Background(), g.handle, recovered); err != nil {
			_ = g.handle.Fence(context.Background())
			return nil, err
		}
		if recovered.Found {
			p.log.Info("recovered the pool's exact state", "blocks_in_checkpoint", recovered.Blocks,
				"journalled_commands", len(recovered.Journal), "written_at", recovered.WrittenAt, "load", recovered.LoadTime)
		}
	}
	if err := p.resubscribe(context.Background(), g); err != nil {
		_ = g.handle.Fence(context.Background())
		return nil, err
	}
	return p, nil
}

func newHostedPool(spec PoolSpec, log *slog.Logger, m *metrics) *hostedPool {
	p := &hostedPool{spec: spec, log: log.With("pool", spec.Name), m: m}
	p.admit = func(ctx context.Context, epoch uint64, ev ckf.RouterEvent) error {
		return p.actor().AdmitEvent(ctx, epoch, ev)
	}
	return p
}

func newHub(cfg Config) (*hub.Hub, error) {
	return hub.New(hub.Config{QueueDeltas: cfg.SubscriberQueue, QueueBytes: cfg.SubscriberQueueBytes,
		SnapshotGenerations: cfg.SnapshotGenerations, MaxSubscribers: cfg.MaxSubscribers, MaxLeaseRecords: cfg.MaxLeaseRecords,
		MaxSubscribersPerClient: cfg.MaxSubscribersPerClient})
}

// startActor starts an actor of the pool journalling into j (if set), over
// a new pool, or over img's (a replica's checkpoint) when img is not nil,
// and drains its faults; the generation has no hub yet.
func (p *hostedPool) startActor(cfg Config, domain ckf.Domain, incarnation uint64, j producer.Journal, img *producer.Image) (*poolGen, error) {
	pcfg := producer.DefaultConfig()
	pcfg.PublicationDelay = time.Duration(p.spec.PublicationDelay)
	// The hub's own lease drains at memory speed; a generous buffer keeps a
	// burst from making the relay's mirror lag and re-snapshot every
	// subscriber.
	pcfg.SubscriberBuffer = hubFeedBuffer
	pcfg.Logger = p.log
	pcfg.Journal = j
	scope := producer.Scope{Pool: ckf.PoolID{Domain: domain, DCID: p.spec.DCID}, ProducerIncarnation: incarnation,
		LayoutGeneration: layoutGeneration}
	var h producer.Handle
	var faults <-chan producer.Fault
	var err error
	if img != nil {
		h, faults, err = producer.StartImage(p.spec.ckfConfig(), img, scope, pcfg)
	} else {
		var pool *ckf.Pool
		if pool, err = ckf.NewPool(p.spec.ckfConfig()); err == nil {
			h, faults, err = producer.Start(pool, scope, pcfg)
		}
	}
	if err != nil {
		return nil, err
	}
	g := &poolGen{handle: h, faultsDone: make(chan struct{})}
	go p.drainFaults(g, faults)
	return g, nil
}

// resubscribe takes a new lease on g's publisher (a higher epoch each time)
// and installs its snapshot into g's hub, then starts feeding deltas.
func (p *hostedPool) resubscribe(ctx context.Context, g *poolGen) error {
	p.mu.Lock()
	p.hubEpoch++
	lease := ckf.LaneLease{ConsumerInstance: hubConsumer, AssignmentEpoch: p.hubEpoch}
	p.mu.Unlock()
	sub, err := g.handle.Subscribe(ctx, lease)
	if err != nil {
		return fmt.Errorf("subscribe hub: %w", err)
	}
	// A replicated pool's snapshot may hold what no stored record covers
	// yet: it reaches the hub only once the records do.
	if err := p.waitRecorded(ctx, g); err != nil {
		// The subscription is dropped: the actor is being discarded.
		return fmt.Errorf("subscribe hub: %w", err)
	}
	g.hub.Install(sub.Snapshot)
	go p.feed(g, sub)
	return nil
}

// waitRecorded waits until everything g's actor journalled so far is in a
// stored append (at once without HA). Reading the position after the
// output was cut is conservative: it covers the output and perhaps a few
// commands more, which the next append carries.
func (p *hostedPool) waitRecorded(ctx context.Context, g *poolGen) error {
	if g.rec == nil {
		return nil
	}
	return p.ha.node.WaitAcked(ctx, g.rec.Position())
}

// feed moves the actor's deltas into the hub until the stream ends, then
// decides: resubscribe (lagged or superseded), or close the hub (shutdown,
// fence). A replicated pool's delta enters the hub only once the records
// covering it are stored; after leadership ends none does.
func (p *hostedPool) feed(g *poolGen, sub *producer.Subscription) {
	deposed := false
	for d := range sub.Deltas() {
		if deposed {
			continue // drain until the actor is fenced
		}
		if err := p.waitRecorded(context.Background(), g); err != nil {
			deposed = true
			continue
		}
		if err := g.hub.Apply(d); err != nil {
			p.log.Error("hub rejected a delta; resubscribing", "err", err)
			break
		}
		p.m.publications.WithLabelValues(p.spec.Name).Inc()
		p.m.images.WithLabelValues(p.spec.Name).Add(float64(len(d.Images)))
	}
	err := sub.Err()
	switch {
	case deposed:
		g.hub.Close(errDeposed)
		close(g.feederDone)
	case errors.Is(err, producer.ErrFenced):
		g.hub.Close(errFenced)
		close(g.feederDone)
	case errors.Is(err, producer.ErrShuttingDown):
		g.hub.Close(errShuttingDown)
		close(g.feederDone)
	default: // lagged, superseded, or a hub error: take a new lease
		if err != nil {
			p.log.Warn("hub stream ended; resubscribing", "err", err)
		}
		if rerr := p.resubscribe(context.Background(), g); rerr != nil {
			// The actor stopped between the stream's end and the new lease:
			// say why, so streams close with the right reason.
			// A fenced actor's errors match ErrShuttingDown too: test the
			// fence first.
			cause := errFenced
			switch {
			case errors.Is(rerr, replica.ErrNotLeader):
				cause = errDeposed
			case !errors.Is(rerr, producer.ErrFenced) && errors.Is(rerr, producer.ErrShuttingDown):
				cause = errShuttingDown
			}
			p.log.Error("hub resubscribe failed", "err", rerr)
			g.hub.Close(cause)
			close(g.feederDone)
		}
	}
}

// drainFaults counts every fault exactly (metric, catalog) but logs them
// rate-limited per category: the first at WARN, later ones only at powers of
// two (with the count so far), so a flood of bad events cannot flood the log.
func (p *hostedPool) drainFaults(g *poolGen, faults <-chan producer.Fault) {
	defer close(g.faultsDone)
	seen := map[producer.FaultCategory]uint64{}
	for f := range faults {
		p.m.faults.WithLabelValues(p.spec.Name, f.Category.String()).Inc()
		p.mu.Lock()
		p.lastFault = f.String()
		p.mu.Unlock()
		seen[f.Category]++
		if n := seen[f.Category]; n&(n-1) == 0 {
			p.log.Warn("pool fault", "fault", f.String(), "category_occurrences", n)
		}
	}
}

// sink is what the pool's sources admit into: the current actor's handle,
// which with a data dir also tells when what was admitted is durable, and
// with HA when it is in a stored record.
func (p *hostedPool) sink() source.Sink {
	g := p.gen()
	switch {
	case g.rec != nil:
		return recordedSink{Handle: g.handle, p: p, g: g}
	case p.journal != nil:
		return durableSink{Handle: g.handle, journal: p.journal}
	}
	return g.handle
}

// durableSink is a pool's handle plus Durable: a Dynamo JetStream source
// acknowledges a message only once its events are in the journal.
type durableSink struct {
	producer.Handle
	journal *persist.PoolLog
}

var _ dynamonats.DurableSink = durableSink{}

// Durable waits until the actor has applied (and so journalled) every
// command admitted before the call, then until the journal committed them.
// The barrier (Handle.Barrier) is answered between two commands, in mailbox
// order, and publishes nothing (Flush would cut the publication delay short
// for every acknowledgement batch).
func (d durableSink) Durable(ctx context.Context) error {
	if err := d.Barrier(ctx); err != nil {
		return err
	}
	return d.journal.WaitDurable(ctx)
}

// shutdown drains admitted work, publishes the tail and closes the hub.
func (p *hostedPool) shutdown(ctx context.Context) error {
	if p.ha != nil {
		return p.ha.stop(ctx)
	}
	return p.stopGen(ctx, p.gen(), false)
}

// stopGen stops g's actor — drained, or fenced when fence is set (a
// deposed leader: what it holds is not the group's) — and waits until its
// goroutines ended.
func (p *hostedPool) stopGen(ctx context.Context, g *poolGen, fence bool) error {
	var err error
	if fence {
		err = g.handle.Fence(ctx)
	} else {
		err = g.handle.Shutdown(ctx)
	}
	// Both goroutines end once the actor has stopped: the feeder when the
	// hub's stream ends, the fault drainer when the fault channel closes.
	// A standby's generation has no feeder: its hub was never fed.
	for _, done := range []chan struct{}{g.feederDone, g.faultsDone} {
		if done == nil {
			continue
		}
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if p.journal != nil {
		// The actor has stopped: nothing more is journalled.
		if jerr := p.journal.Close(ctx); jerr != nil && err == nil {
			err = jerr
		}
	}
	return err
}
