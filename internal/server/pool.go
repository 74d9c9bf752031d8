package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/hub"
	"github.com/ckfrelay/ckfrelay/internal/persist"
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
)

// hostedPool is one pool: its actor, the hub that mirrors the actor's stream,
// and the goroutines that feed the hub and drain the fault channel.
type hostedPool struct {
	spec   PoolSpec
	handle producer.Handle
	hub    *hub.Hub
	log    *slog.Logger
	// journal keeps the exact state on disk; nil without a data dir.
	journal *persist.PoolLog
	m       *metrics

	feederDone chan struct{}
	faultsDone chan struct{}

	// admit is handle.AdmitEvent; tests replace it to fail part way.
	admit func(ctx context.Context, sourceEpoch uint64, ev ckf.RouterEvent) error

	mu        sync.Mutex
	hubEpoch  uint64
	lastFault string
}

func startPool(spec PoolSpec, cfg Config, domain ckf.Domain, incarnation uint64, log *slog.Logger, m *metrics, store *persist.Store) (*hostedPool, error) {
	pool, err := ckf.NewPool(spec.ckfConfig())
	if err != nil {
		return nil, err
	}
	var journal *persist.PoolLog
	var recovered persist.Recovered
	if store != nil {
		journal = store.Pool(spec.Name, persist.Options{Logger: log.With("pool", spec.Name)})
		if recovered, err = journal.Load(); err != nil {
			return nil, err
		}
	}
	pcfg := producer.DefaultConfig()
	pcfg.PublicationDelay = time.Duration(spec.PublicationDelay)
	// The hub's own lease drains at memory speed; a generous buffer keeps a
	// burst from making the relay's mirror lag and re-snapshot every
	// subscriber.
	pcfg.SubscriberBuffer = hubFeedBuffer
	pcfg.Logger = log
	if journal != nil {
		pcfg.Journal = journal
	}
	scope := producer.Scope{Pool: ckf.PoolID{Domain: domain, DCID: spec.DCID}, ProducerIncarnation: incarnation,
		LayoutGeneration: layoutGeneration}
	h, faults, err := producer.Start(pool, scope, pcfg)
	if err != nil {
		return nil, err
	}
	hb, err := hub.New(hub.Config{QueueDeltas: cfg.SubscriberQueue, QueueBytes: cfg.SubscriberQueueBytes,
		SnapshotGenerations: cfg.SnapshotGenerations, MaxSubscribers: cfg.MaxSubscribers, MaxLeaseRecords: cfg.MaxLeaseRecords,
		MaxSubscribersPerClient: cfg.MaxSubscribersPerClient})
	if err != nil {
		return nil, err
	}
	p := &hostedPool{spec: spec, handle: h, hub: hb, log: log.With("pool", spec.Name), m: m, journal: journal,
		feederDone: make(chan struct{}), faultsDone: make(chan struct{})}
	p.admit = h.AdmitEvent
	go p.drainFaults(faults)
	if journal != nil {
		// Replay what the last run admitted before anyone can subscribe:
		// the recovered state is published as this incarnation's.
		if err := journal.Restore(context.Background(), h, recovered); err != nil {
			_ = h.Fence(context.Background())
			return nil, err
		}
		if recovered.Found {
			p.log.Info("recovered the pool's exact state", "blocks_in_checkpoint", recovered.Blocks,
				"journalled_commands", len(recovered.Journal), "written_at", recovered.WrittenAt, "load", recovered.LoadTime)
		}
	}
	if err := p.resubscribe(context.Background()); err != nil {
		_ = h.Fence(context.Background())
		return nil, err
	}
	return p, nil
}

// resubscribe takes a new lease on the publisher (a higher epoch each time)
// and installs its snapshot into the hub, then starts feeding deltas.
func (p *hostedPool) resubscribe(ctx context.Context) error {
	p.mu.Lock()
	p.hubEpoch++
	lease := ckf.LaneLease{ConsumerInstance: hubConsumer, AssignmentEpoch: p.hubEpoch}
	p.mu.Unlock()
	sub, err := p.handle.Subscribe(ctx, lease)
	if err != nil {
		return fmt.Errorf("subscribe hub: %w", err)
	}
	p.hub.Install(sub.Snapshot)
	go p.feed(sub)
	return nil
}

// feed moves the actor's deltas into the hub until the stream ends, then
// decides: resubscribe (lagged or superseded), or close the hub (shutdown,
// fence).
func (p *hostedPool) feed(sub *producer.Subscription) {
	for d := range sub.Deltas() {
		if err := p.hub.Apply(d); err != nil {
			p.log.Error("hub rejected a delta; resubscribing", "err", err)
			break
		}
		p.m.publications.WithLabelValues(p.spec.Name).Inc()
		p.m.images.WithLabelValues(p.spec.Name).Add(float64(len(d.Images)))
	}
	err := sub.Err()
	switch {
	case errors.Is(err, producer.ErrFenced):
		p.hub.Close(errFenced)
		close(p.feederDone)
	case errors.Is(err, producer.ErrShuttingDown):
		p.hub.Close(errShuttingDown)
		close(p.feederDone)
	default: // lagged, superseded, or a hub error: take a new lease
		if err != nil {
			p.log.Warn("hub stream ended; resubscribing", "err", err)
		}
		if rerr := p.resubscribe(context.Background()); rerr != nil {
			// The actor stopped between the stream's end and the new lease:
			// say why, so streams close with the right reason.
			// A fenced actor's errors match ErrShuttingDown too: test the
			// fence first.
			cause := errFenced
			if !errors.Is(rerr, producer.ErrFenced) && errors.Is(rerr, producer.ErrShuttingDown) {
				cause = errShuttingDown
			}
			p.log.Error("hub resubscribe failed", "err", rerr)
			p.hub.Close(cause)
			close(p.feederDone)
		}
	}
}

// drainFaults counts every fault exactly (metric, catalog) but logs them
// rate-limited per category: the first at WARN, later ones only at powers of
// two (with the count so far), so a flood of bad events cannot flood the log.
func (p *hostedPool) drainFaults(faults <-chan producer.Fault) {
	defer close(p.faultsDone)
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

// sink is what the pool's sources admit into: the actor's handle, which with
// a data dir also tells when what was admitted is durable.
func (p *hostedPool) sink() source.Sink {
	if p.journal == nil {
		return p.handle
	}
	return durableSink{Handle: p.handle, journal: p.journal}
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
// The barrier is a Stats request: answered between two commands, in mailbox
// order, it publishes nothing (Flush would cut the publication delay short
// for every acknowledgement batch).
func (d durableSink) Durable(ctx context.Context) error {
	if _, err := d.Stats(ctx); err != nil {
		return err
	}
	return d.journal.WaitDurable(ctx)
}

// shutdown drains admitted work, publishes the tail and closes the hub.
func (p *hostedPool) shutdown(ctx context.Context) error {
	err := p.handle.Shutdown(ctx)
	// Both goroutines end once the actor has stopped: the feeder when the
	// hub's stream ends, the fault drainer when the fault channel closes.
	for _, done := range []chan struct{}{p.feederDone, p.faultsDone} {
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
