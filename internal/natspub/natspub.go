// Package natspub broadcasts one pool's frames through NATS JetStream
// (docs/wire.md §7, docs/deploy.md): it holds one subscription on the pool's
// hub like any remote subscriber, publishes every delta and heartbeat on the
// pool's subject and keeps the newest snapshot in an object store bucket,
// refreshed on a cadence the stream's retention is tied to. Routers read the
// snapshot, then the stream from the sequence the snapshot names, and stamp
// their own lease on every frame before their consumer sees it.
package natspub

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client/natsjs"
	"github.com/ckfrelay/ckfrelay/internal/hub"
	"github.com/ckfrelay/ckfrelay/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Consumer is the consumer instance of the publisher's hub lease; the frames
// it publishes carry that lease (lane 0), which routers replace with theirs.
const Consumer uint64 = 0x4E415453 // "NATS"

// snapshotChunkBytes bounds one snapshot chunk frame in the object (as on
// HTTP streams).
const snapshotChunkBytes = 256 << 10

// Defaults.
const (
	DefaultSnapshotInterval = 30 * time.Second
	DefaultHeartbeat        = time.Second
)

// Config configures one pool's publisher.
type Config struct {
	// Pool is the pool's name; Prefix prefixes its resource names
	// (natsjs.For).
	Pool, Prefix string
	// SnapshotInterval is the snapshot refresh cadence (default 30s); the
	// stream keeps natsjs.Retention(SnapshotInterval) of frames.
	SnapshotInterval time.Duration
	// Heartbeat is the idle heartbeat interval (default 1s).
	Heartbeat time.Duration
	// Replicas of the stream and bucket (default 1).
	Replicas int
	// MemoryStorage keeps the stream and bucket in memory instead of files.
	MemoryStorage bool
	// EndReason maps a hub's close cause to the close frame's reason; nil
	// means producer_changed for every cause.
	EndReason func(error) wire.CloseReason
	// Logger (default: discard).
	Logger *slog.Logger
	// Leading, when set, is asked before every publish and snapshot write:
	// once it says false the publisher publishes nothing more — no frame,
	// no end frames — and Run returns ErrNotLeading. A replicated pool's
	// leader (internal/replica) sets it to its lease's validity by its own
	// clock, so a leader resumed after a suspension past its lease stops
	// before its replica loop notices.
	Leading func() bool
}

// ErrNotLeading ends Run when Config.Leading says the pool's replica no
// longer leads.
var ErrNotLeading = errors.New("natspub: this replica no longer leads the pool")

// fenced returns ErrNotLeading when the replica does not lead.
func (p *Publisher) fenced() error {
	if p.cfg.Leading != nil && !p.cfg.Leading() {
		return ErrNotLeading
	}
	return nil
}

// Stats is a point-in-time view of a publisher.
type Stats struct {
	Deltas, Heartbeats, Snapshots uint64
	// Retries counts failed publishes retried and failed attempts to set
	// up the stream and bucket (NATS unreachable); Resubscribes hub
	// subscriptions after the first (a lag or a producer change).
	Retries, Resubscribes uint64
	// Sequence is the last delta sequence published; SnapshotSequence the
	// sequence of the newest snapshot written.
	Sequence, SnapshotSequence uint64
	LastError                  string
}

// Publisher broadcasts one pool.
type Publisher struct {
	js     jetstream.JetStream
	h      *hub.Hub
	cfg    Config
	layout natsjs.Layout
	log    *slog.Logger

	mu    sync.Mutex
	stats Stats

	// loop state (Run's goroutine only)
	epoch    uint64
	lease    ckf.LaneLease
	identity ckf.ProducerIdentity
	words    []uint64 // the mirror at seq, for snapshots
	seq      uint64
	lastAck  uint64 // highest stream sequence acknowledged
	lost     bool   // the stream lost messages: write a snapshot after the next ack
	stream   jetstream.Stream
	obs      jetstream.ObjectStore
	frame    []byte
}

// New returns a publisher of h's stream; it does nothing until Run.
func New(js jetstream.JetStream, h *hub.Hub, cfg Config) (*Publisher, error) {
	layout, err := natsjs.For(cfg.Prefix, cfg.Pool)
	if err != nil {
		return nil, err
	}
	if cfg.SnapshotInterval <= 0 {
		cfg.SnapshotInterval = DefaultSnapshotInterval
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Publisher{js: js, h: h, cfg: cfg, layout: layout, log: cfg.Logger.With("pool", cfg.Pool, "transport", "nats")}, nil
}

// Layout returns the pool's resource names.
func (p *Publisher) Layout() natsjs.Layout { return p.layout }

// Stats returns the publisher's counters.
func (p *Publisher) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

func (p *Publisher) count(f func(*Stats)) {
	p.mu.Lock()
	f(&p.stats)
	p.mu.Unlock()
}

// errRestart ends one hub session: subscribe again.
var errRestart = errors.New("natspub: restart from a new hub snapshot")

// Run publishes until the hub closes (after publishing its final frames) or
// ctx ends. It retries NATS failures by itself: while NATS is unreachable the
// hub subscription may lag, and the next session then starts from a fresh
// snapshot, which readers reach through the gap their consumer detects.
func (p *Publisher) Run(ctx context.Context) error {
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		if err := p.ensure(ctx); err != nil {
			// An unreachable NATS is what an operator watches retries for.
			p.count(func(s *Stats) { s.Retries++ })
			p.fail(err)
			if !sleep(ctx, &backoff) {
				break
			}
			continue
		}
		p.epoch++
		p.lease = ckf.LaneLease{ConsumerInstance: Consumer, AssignmentEpoch: p.epoch}
		sub, err := p.h.Subscribe(p.lease)
		switch {
		case errors.Is(err, hub.ErrClosed):
			return nil
		case err != nil: // not ready yet, or the subscriber limit
			p.fail(err)
			if !sleep(ctx, &backoff) {
				return ctx.Err()
			}
			continue
		}
		if p.epoch > 1 {
			p.count(func(s *Stats) { s.Resubscribes++ })
		}
		backoff = 50 * time.Millisecond
		err = p.session(ctx, sub)
		sub.Cancel()
		if err == nil { // the hub closed and the end was published
			return nil
		}
		if errors.Is(err, ErrNotLeading) {
			p.fail(err)
			return err
		}
		if !errors.Is(err, errRestart) {
			p.fail(err)
		}
	}
	return ctx.Err()
}

func sleep(ctx context.Context, d *time.Duration) bool {
	t := time.NewTimer(*d)
	defer t.Stop()
	*d = min(2**d, 2*time.Second)
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (p *Publisher) fail(err error) {
	p.log.Warn("nats publisher", "err", err)
	p.count(func(s *Stats) { s.LastError = err.Error() })
}

// ensure creates or updates the stream and the bucket.
func (p *Publisher) ensure(ctx context.Context) error {
	if p.stream != nil && p.obs != nil {
		return nil
	}
	storage := jetstream.FileStorage
	if p.cfg.MemoryStorage {
		storage = jetstream.MemoryStorage
	}
	retention := natsjs.Retention(p.cfg.SnapshotInterval)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := p.js.CreateOrUpdateStream(cctx, jetstream.StreamConfig{
		Name:        p.layout.Stream,
		Description: "ckfrelay frames of pool " + p.cfg.Pool,
		Subjects:    []string{p.layout.Subject},
		MaxAge:      retention,
		Duplicates:  natsjs.DuplicateWindow(retention),
		Storage:     storage,
		Replicas:    p.cfg.Replicas,
		Discard:     jetstream.DiscardOld,
	})
	if err != nil {
		return fmt.Errorf("natspub: stream %s: %w", p.layout.Stream, err)
	}
	obs, err := p.js.CreateOrUpdateObjectStore(cctx, jetstream.ObjectStoreConfig{
		Bucket:      p.layout.Bucket,
		Description: "ckfrelay snapshot of pool " + p.cfg.Pool,
		Storage:     storage,
		Replicas:    p.cfg.Replicas,
	})
	if err != nil {
		return fmt.Errorf("natspub: bucket %s: %w", p.layout.Bucket, err)
	}
	info, err := st.Info(cctx)
	if err != nil {
		return fmt.Errorf("natspub: stream info: %w", err)
	}
	if info.State.LastSeq < p.lastAck {
		p.lost = true // recreated while we were away
	}
	p.stream, p.obs, p.lastAck = st, obs, info.State.LastSeq
	return nil
}

// session publishes one hub subscription: the snapshot first, then every
// delta, heartbeats while idle and a refreshed snapshot every interval.
func (p *Publisher) session(ctx context.Context, sub *hub.Subscription) error {
	// The hub shares an immutable snapshot generation, read a part at a
	// time; the publisher keeps its own mirror, advanced by every delta.
	snap := sub.Snapshot()
	p.identity, p.seq = snap.Identity, snap.Sequence
	n := int(snap.Identity.Format.BucketCount)
	p.words = slices.Grow(p.words[:0], n)[:n]
	for off := 0; off < n; {
		k, err := sub.ReadSnapshot(off, p.words[off:])
		if err == nil && k == 0 {
			err = fmt.Errorf("snapshot ends at word %d of %d", off, n)
		}
		if err != nil {
			return fmt.Errorf("%w: snapshot read: %v", errRestart, err)
		}
		off += k
	}
	if err := p.putSnapshot(ctx, sub); err != nil {
		return err
	}
	hb := time.NewTicker(p.cfg.Heartbeat)
	defer hb.Stop()
	refresh := time.NewTicker(p.cfg.SnapshotInterval)
	defer refresh.Stop()
	for {
		wake := sub.Wait()
		d, ok, err := sub.Poll()
		if ok {
			if err := p.delta(ctx, sub, d); err != nil {
				return err
			}
			hb.Reset(p.cfg.Heartbeat)
			continue
		}
		if err != nil {
			return p.end(ctx, sub)
		}
		select {
		case <-wake:
		case <-hb.C:
			if err := p.heartbeat(ctx, sub); err != nil {
				return err
			}
		case <-refresh.C:
			if err := p.putSnapshot(ctx, sub); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// delta applies d to the mirror and publishes it. A delta NATS refuses as
// too large for its max_payload (a mass reset) is covered by an immediate
// snapshot: readers see the gap and re-snapshot.
func (p *Publisher) delta(ctx context.Context, sub *hub.Subscription, d ckf.Delta) error {
	if d.Identity != p.identity || d.BaseSequence != p.seq {
		return fmt.Errorf("%w: delta %d→%d after %d", errRestart, d.BaseSequence, d.Sequence, p.seq)
	}
	for _, im := range d.Images {
		if int(im.Bucket) >= len(p.words) {
			return fmt.Errorf("%w: image bucket %d outside %d", errRestart, im.Bucket, len(p.words))
		}
		p.words[im.Bucket] = im.Word
	}
	p.seq = d.Sequence
	err := p.publish(ctx, sub, &wire.Frame{Kind: wire.KindDelta, Delta: d}, natsjs.MsgID(d.Identity.ProducerIncarnation, d.Sequence))
	if errors.Is(err, nats.ErrMaxPayload) {
		p.log.Warn("delta exceeds the NATS max payload; publishing a snapshot instead", "sequence", d.Sequence, "images", len(d.Images))
		return p.putSnapshot(ctx, sub)
	}
	if err != nil {
		return err
	}
	p.count(func(s *Stats) { s.Deltas++; s.Sequence = d.Sequence })
	return nil
}

// publish publishes one frame, retrying until it is acknowledged, the hub
// subscription ends without a clean shutdown (a lag: the next session
// re-snapshots) or ctx ends. With a message id, a retry of a message that was
// stored but whose ack was lost is deduplicated by the server.
func (p *Publisher) publish(ctx context.Context, sub *hub.Subscription, f *wire.Frame, msgID string) error {
	var err error
	p.frame, err = wire.AppendFrame(p.frame[:0], f)
	if err != nil {
		return err
	}
	backoff := 20 * time.Millisecond
	for {
		if err := p.fenced(); err != nil {
			return err
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var ack *jetstream.PubAck
		if msgID != "" {
			ack, err = p.js.Publish(pctx, p.layout.Subject, p.frame, jetstream.WithMsgID(msgID))
		} else {
			ack, err = p.js.Publish(pctx, p.layout.Subject, p.frame)
		}
		cancel()
		if err == nil {
			return p.acked(ctx, sub, ack)
		}
		if errors.Is(err, nats.ErrMaxPayload) || ctx.Err() != nil {
			return err
		}
		p.count(func(s *Stats) { s.Retries++; s.LastError = err.Error() })
		if errors.Is(err, jetstream.ErrNoStreamResponse) {
			// No stream stores the subject (deleted, or a server that lost
			// its store): create it again before the retry.
			p.stream = nil
			if eerr := p.ensure(ctx); eerr != nil {
				p.count(func(s *Stats) { s.LastError = eerr.Error() })
			}
		}
		if sub != nil && sub.Err() != nil && !p.closing(sub) {
			return fmt.Errorf("%w: hub subscription ended (%v) while NATS failed: %v", errRestart, sub.Err(), err)
		}
		if !sleep(ctx, &backoff) {
			return ctx.Err()
		}
	}
}

// closing reports whether sub ended because the hub closed (shutdown or
// fence), whose final frames are still to be published.
func (p *Publisher) closing(sub *hub.Subscription) bool {
	err := sub.Err()
	return err != nil && !errors.Is(err, hub.ErrLagged) && !errors.Is(err, hub.ErrProducerChanged) &&
		!errors.Is(err, hub.ErrBrokenStream) && !errors.Is(err, hub.ErrSuperseded) && !errors.Is(err, context.Canceled)
}

func (p *Publisher) heartbeat(ctx context.Context, sub *hub.Subscription) error {
	f := wire.Frame{Kind: wire.KindHeartbeat, Heartbeat: wire.Heartbeat{Identity: p.identity, Lease: p.lease,
		LastSequence: p.seq, UnixMicros: time.Now().UnixMicro()}}
	// A heartbeat is not retried: the next one says the same.
	var err error
	if p.frame, err = wire.AppendFrame(p.frame[:0], &f); err != nil {
		return err
	}
	if err := p.fenced(); err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, p.cfg.Heartbeat)
	defer cancel()
	ack, err := p.js.Publish(pctx, p.layout.Subject, p.frame)
	if err != nil {
		p.count(func(s *Stats) { s.LastError = err.Error() })
		return nil
	}
	p.count(func(s *Stats) { s.Heartbeats++ })
	return p.acked(ctx, sub, ack)
}

// acked records a message's stream sequence. One below the highest seen
// means the stream lost messages (recreated, or a memory store restarted):
// the snapshot's stream sequence then points past the stream's end, so a new
// snapshot is written after this message.
func (p *Publisher) acked(ctx context.Context, sub *hub.Subscription, ack *jetstream.PubAck) error {
	if p.lost || (ack.Sequence < p.lastAck && !ack.Duplicate) {
		p.lastAck, p.lost = ack.Sequence, false
		p.log.Warn("the frames stream lost messages; writing a new snapshot", "stream_seq", ack.Sequence)
		return p.putSnapshot(ctx, sub)
	}
	p.lastAck = max(p.lastAck, ack.Sequence)
	return nil
}

// putSnapshot writes the mirror as the pool's snapshot object, naming the
// stream sequence after the last acknowledged message as where to read on.
func (p *Publisher) putSnapshot(ctx context.Context, sub *hub.Subscription) error {
	snap := ckf.Snapshot{Identity: p.identity, Lease: p.lease, Sequence: p.seq, Words: p.words}
	var buf bytes.Buffer
	if err := wire.NewWriter(&buf, snapshotChunkBytes).WriteSnapshot(&snap); err != nil {
		return err
	}
	meta := map[string]string{
		natsjs.MetaSequence:       strconv.FormatUint(p.seq, 10),
		natsjs.MetaIncarnation:    strconv.FormatUint(p.identity.ProducerIncarnation, 10),
		natsjs.MetaStreamSequence: strconv.FormatUint(p.lastAck+1, 10),
	}
	backoff := 20 * time.Millisecond
	for {
		if err := p.fenced(); err != nil {
			return err
		}
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := p.obs.Put(pctx, jetstream.ObjectMeta{Name: natsjs.SnapshotObject, Metadata: meta}, bytes.NewReader(buf.Bytes()))
		cancel()
		if err == nil {
			p.count(func(s *Stats) { s.Snapshots++; s.SnapshotSequence = p.seq })
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		p.count(func(s *Stats) { s.Retries++; s.LastError = err.Error() })
		if errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
			p.obs = nil // the bucket was deleted: create it again
			if eerr := p.ensure(ctx); eerr != nil {
				p.count(func(s *Stats) { s.LastError = eerr.Error() })
			}
		}
		if sub.Err() != nil && !p.closing(sub) {
			return fmt.Errorf("%w: hub subscription ended (%v) while NATS failed: %v", errRestart, sub.Err(), err)
		}
		if !sleep(ctx, &backoff) {
			return ctx.Err()
		}
	}
}

// end handles the end of the hub subscription: after a lag or a producer
// change, restart from a new snapshot; when the hub closed, publish what is
// still queued, a drain marker on a clean shutdown, and a close frame.
func (p *Publisher) end(ctx context.Context, sub *hub.Subscription) error {
	if !p.closing(sub) {
		return fmt.Errorf("%w: %v", errRestart, sub.Err())
	}
	cause := sub.Err()
	for {
		d, err := sub.Next(ctx)
		if err != nil {
			break
		}
		if err := p.delta(ctx, sub, d); err != nil {
			return err
		}
	}
	reason := wire.CloseProducerChanged
	if p.cfg.EndReason != nil {
		reason = p.cfg.EndReason(cause)
	}
	if reason == wire.CloseShuttingDown {
		drain := wire.Frame{Kind: wire.KindDrainMarker, Drain: ckf.DrainMarker{Lease: p.lease, ExpectedSequence: p.seq}}
		if err := p.publish(ctx, sub, &drain, ""); err != nil {
			return err
		}
	}
	cl := wire.Frame{Kind: wire.KindClose, Close: wire.Close{Reason: reason, Message: fmt.Sprint(cause)}}
	return p.publish(ctx, sub, &cl, "")
}
