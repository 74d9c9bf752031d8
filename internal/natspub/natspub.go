// Package natspub broadcasts one pool's frames through NATS JetStream
// (docs/wire.md §7, docs/deploy.md): it holds one subscription on the pool's
// hub like any remote subscriber, publishes every delta and heartbeat on the
// pool's subject and keeps the newest snapshot in an object store bucket,
// refreshed on a cadence the stream's retention is tied to. Routers read the
// snapshot the pointer names, then the stream from the sequence it names, and
// stamp their own lease on every frame before their consumer sees it.
//
// Publishes are fenced by the stream itself: each one expects the
// publisher's previous message as the subject's last
// (Nats-Expected-Last-Subject-Sequence), so once another publisher (a new
// leader of a replicated pool) has published, a late frame of this one is
// refused by the stream leader instead of stored, and so is its pointer to a
// snapshot (docs/RATIONALE.md "Why is the fan-out chained by expected
// subject sequence, with a snapshot object per incarnation behind a
// pointer?").
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
	"github.com/ckfrelay/ckfrelay/internal/jsexpect"
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
	// Heartbeat is the idle heartbeat interval (default 1s; at most
	// SnapshotInterval, so the subject's last message never ages out).
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
	// before its replica loop notices. It also decides what a refused
	// publish does: while it says true (or without it) the publisher chains
	// on from the subject's tail; otherwise Run returns ErrOvertaken.
	Leading func() bool
}

// ErrNotLeading ends Run when Config.Leading says the pool's replica no
// longer leads.
var ErrNotLeading = errors.New("natspub: this replica no longer leads the pool")

// ErrOvertaken ends Run when the stream refused a publish because the
// subject's last message is another publisher's and Config.Leading says
// this replica no longer leads: a new leader publishes the pool now.
var ErrOvertaken = errors.New("natspub: another publisher's message is the pool's stream tail")

// overtaken decides what a refused publish means once the subject's tail is
// known not to be the message retried: ErrOvertaken when this replica no
// longer leads — a new leader can only exist after this one's lease
// deadline, so a deposed publisher always finds it passed. Otherwise (a
// deposed leader's late frame that beat this leader's first, a message
// published by hand, an emptied subject) the chain goes on from the tail,
// and readers need a new snapshot: the one they load would lead them
// through the foreign message. The tail's message id is not trusted: anyone
// who can publish on the subject can write any id.
func (p *Publisher) overtaken(id string, tail jsexpect.Tail) error {
	what := fmt.Sprintf("%s expected stream sequence %d, the tail is %d (%q)", id, p.chain, tail.Seq, tail.ID)
	if p.cfg.Leading != nil && !p.cfg.Leading() {
		p.count(func(s *Stats) { s.Overtaken++ })
		return fmt.Errorf("%w: %s", ErrOvertaken, what)
	}
	if tail.Seq != 0 {
		p.count(func(s *Stats) { s.Overtaken++ })
	}
	p.log.Warn("the frames subject's tail is not this publisher's; chaining on from it with a new snapshot", "tail", what)
	p.chain, p.lost = tail.Seq, true
	return nil
}

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
	// Overtaken counts publishes the stream refused because another
	// publisher's message was the subject's tail (a new chain started, or
	// Run returned ErrOvertaken).
	Overtaken uint64
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

	cleaning sync.WaitGroup // deletion of older incarnations' objects; Run waits for it

	// loop state (Run's goroutine only)
	epoch    uint64
	lease    ckf.LaneLease
	identity ckf.ProducerIdentity
	words    []uint64 // the mirror at seq, for snapshots
	seq      uint64
	// chain is the stream sequence of this publisher's last message on the
	// frames subject (or the tail read when the chain started): every
	// publish expects it as the subject's last.
	chain   uint64
	chained bool   // chain was read from the stream since the last refusal
	cleaned bool   // objects of older incarnations deleted since the chain started
	n       uint64 // messages published (the last part of their ids)
	lost    bool   // a snapshot is due: the chain went on past a foreign message or a loss
	snapAt  time.Time
	stream  jetstream.Stream
	obs     jetstream.ObjectStore
	frame   []byte
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
	// The stream keeps three snapshot intervals: a heartbeat at least every
	// interval keeps the chain's last message from aging out while idle.
	cfg.Heartbeat = min(cfg.Heartbeat, cfg.SnapshotInterval)
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
	defer p.cleaning.Wait()
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
		if !p.chained {
			if err := p.startChain(ctx); err != nil {
				p.count(func(s *Stats) { s.Retries++ })
				p.fail(err)
				if !sleep(ctx, &backoff) {
					break
				}
				continue
			}
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
		if errors.Is(err, ErrOvertaken) {
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
		Subjects:    []string{p.layout.Subject, p.layout.Pointer},
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
	p.stream, p.obs = st, obs
	return nil
}

// startChain reads the frames subject's last message: the new chain's first
// publish expects it. Whoever published it, this publisher's next message
// is stored only if nothing was published in between.
func (p *Publisher) startChain(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tail, err := p.tail(cctx)
	if err != nil {
		return err
	}
	p.chain, p.chained, p.cleaned = tail.Seq, true, false
	return nil
}

// stored reports whether the message at stream sequence seq is data on
// subject: a duplicate answer names the message that holds the id, which is
// this publisher's earlier attempt or someone else's.
func (p *Publisher) stored(ctx context.Context, seq uint64, subject string, data []byte) bool {
	m, err := p.msg(ctx, seq)
	return err == nil && m.Subject == subject && bytes.Equal(m.Data, data)
}

func (p *Publisher) msg(ctx context.Context, seq uint64) (*jetstream.RawStreamMsg, error) {
	if p.stream == nil { // dropped after a publish no stream answered
		if err := p.ensure(ctx); err != nil {
			return nil, err
		}
	}
	return p.stream.GetMsg(ctx, seq)
}

func (p *Publisher) tail(ctx context.Context) (jsexpect.Tail, error) {
	if p.stream == nil { // dropped after a publish no stream answered
		if err := p.ensure(ctx); err != nil {
			return jsexpect.Tail{}, err
		}
	}
	t, err := jsexpect.ReadTail(ctx, p.stream, p.layout.Subject)
	if err != nil {
		return jsexpect.Tail{}, fmt.Errorf("natspub: the tail of %s: %w", p.layout.Subject, err)
	}
	return t, nil
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
	// The session's first message is a heartbeat at the snapshot's
	// sequence: once it is stored, the subject's tail is this chain's, so
	// the stream sequence the snapshot names is followed by this
	// publisher's frames only.
	if err := p.beat(ctx, sub); err != nil {
		return err
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
	err := p.publish(ctx, sub, &wire.Frame{Kind: wire.KindDelta, Delta: d})
	if errors.Is(err, nats.ErrMaxPayload) {
		p.log.Warn("delta exceeds the NATS max payload; publishing a snapshot instead", "sequence", d.Sequence, "images", len(d.Images))
		return p.putSnapshot(ctx, sub)
	}
	if err != nil {
		return err
	}
	p.count(func(s *Stats) { s.Deltas++; s.Sequence = d.Sequence })
	return p.resnapshot(ctx, sub)
}

// publish publishes one frame expecting the chain's last message, retrying
// until it is acknowledged, the hub subscription ends without a clean
// shutdown (a lag: the next session re-snapshots) or ctx ends. Its message
// id names the incarnation, the sequence and the publisher's count, so a
// retry of a message that was stored but whose ack was lost is a duplicate
// (or, on a standalone server, which checks the expectation first, a
// refusal whose tail is this very message).
func (p *Publisher) publish(ctx context.Context, sub *hub.Subscription, f *wire.Frame) error {
	var err error
	p.frame, err = wire.AppendFrame(p.frame[:0], f)
	if err != nil {
		return err
	}
	p.n++
	id := natsjs.MsgID(p.identity.ProducerIncarnation, p.seq, p.n)
	backoff := 20 * time.Millisecond
	for {
		if err := p.fenced(); err != nil {
			return err
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ack, err := p.js.PublishMsg(pctx, &nats.Msg{Subject: p.layout.Subject, Data: p.frame},
			jetstream.WithMsgID(id), jetstream.WithExpectLastSequencePerSubject(p.chain))
		if err == nil && ack.Duplicate && !p.stored(pctx, ack.Sequence, p.layout.Subject, p.frame) {
			// Another message took this id first (ids are predictable, and
			// the stream deduplicates across its subjects): publish under
			// the next one.
			cancel()
			p.log.Warn("a message of another publisher holds this frame's id", "id", id, "stream_seq", ack.Sequence)
			p.n++
			id = natsjs.MsgID(p.identity.ProducerIncarnation, p.seq, p.n)
			continue
		}
		if err == nil {
			cancel()
			p.chain = max(p.chain, ack.Sequence)
			return nil
		}
		answer := jsexpect.Classify(err)
		var tail jsexpect.Tail
		var terr error
		if answer.Expectation() {
			tail, terr = p.tail(pctx)
		}
		cancel()
		switch {
		case answer.Expectation() && terr == nil && tail.Stored(id, p.chain):
			p.chain = tail.Seq // an earlier attempt was stored
			return nil
		case answer == jsexpect.Refused && terr == nil:
			if err := p.overtaken(id, tail); err != nil {
				return err
			}
			continue
		case errors.Is(err, nats.ErrMaxPayload) || ctx.Err() != nil:
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
		if err := p.restartable(sub, err); err != nil {
			return err
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

// heartbeat publishes a heartbeat at the mirror's sequence. It is retried
// like any frame: a heartbeat stored without its ack would otherwise be a
// message of this chain the next publish does not expect.
func (p *Publisher) heartbeat(ctx context.Context, sub *hub.Subscription) error {
	if err := p.beat(ctx, sub); err != nil {
		return err
	}
	return p.resnapshot(ctx, sub)
}

func (p *Publisher) beat(ctx context.Context, sub *hub.Subscription) error {
	f := wire.Frame{Kind: wire.KindHeartbeat, Heartbeat: wire.Heartbeat{Identity: p.identity, Lease: p.lease,
		LastSequence: p.seq, UnixMicros: time.Now().UnixMicro()}}
	if err := p.publish(ctx, sub, &f); err != nil {
		return err
	}
	p.count(func(s *Stats) { s.Heartbeats++ })
	return nil
}

// resnapshot writes a new snapshot once the chain went on past a message
// that is not this publisher's (or the subject lost messages): the one
// readers load would lead them through it, or name frames that are gone.
// At most one a heartbeat interval: messages published by hand on the
// subject do not make a snapshot each.
func (p *Publisher) resnapshot(ctx context.Context, sub *hub.Subscription) error {
	if !p.lost || time.Since(p.snapAt) < p.cfg.Heartbeat {
		return nil
	}
	return p.putSnapshot(ctx, sub)
}

// putSnapshot writes the mirror as its incarnation's snapshot object, naming
// the stream sequence after the chain's last message as where to read on,
// then moves the pointer to it. A deposed publisher's late object is its own
// incarnation's, never the new leader's, and its pointer is refused.
func (p *Publisher) putSnapshot(ctx context.Context, sub *hub.Subscription) error {
	snap := ckf.Snapshot{Identity: p.identity, Lease: p.lease, Sequence: p.seq, Words: p.words}
	var buf bytes.Buffer
	if err := wire.NewWriter(&buf, snapshotChunkBytes).WriteSnapshot(&snap); err != nil {
		return err
	}
	for {
		p.lost = false
		ptr := natsjs.Pointer{Object: natsjs.SnapshotObjectName(p.identity.ProducerIncarnation), Sequence: p.seq,
			Incarnation: p.identity.ProducerIncarnation, StreamSequence: p.chain + 1}
		if err := p.putObject(ctx, sub, ptr, buf.Bytes()); err != nil {
			return err
		}
		err := p.point(ctx, sub, ptr)
		if errors.Is(err, errMoved) {
			// The chain went on past a foreign message: put a frame of
			// this chain after it, then a snapshot that reads on from
			// there.
			if err := p.beat(ctx, sub); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		if !p.cleaned {
			// Off the publishing path: listing the bucket creates a
			// consumer, and routers already read the new snapshot.
			p.cleaned = true
			p.cleaning.Go(func() { p.clean(ctx, ptr.Incarnation) })
		}
		p.snapAt = time.Now()
		p.count(func(s *Stats) { s.Snapshots++; s.SnapshotSequence = p.seq })
		return nil
	}
}

// putObject writes data as ptr's object, retrying until it is stored.
func (p *Publisher) putObject(ctx context.Context, sub *hub.Subscription, ptr natsjs.Pointer, data []byte) error {
	meta := map[string]string{
		natsjs.MetaSequence:       strconv.FormatUint(ptr.Sequence, 10),
		natsjs.MetaIncarnation:    strconv.FormatUint(ptr.Incarnation, 10),
		natsjs.MetaStreamSequence: strconv.FormatUint(ptr.StreamSequence, 10),
	}
	backoff := 20 * time.Millisecond
	for {
		if err := p.fenced(); err != nil {
			return err
		}
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := p.obs.Put(pctx, jetstream.ObjectMeta{Name: ptr.Object, Metadata: meta}, bytes.NewReader(data))
		cancel()
		if err == nil {
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
		if err := p.restartable(sub, err); err != nil {
			return err
		}
		if !sleep(ctx, &backoff) {
			return ctx.Err()
		}
	}
}

func samePointer(h nats.Header, ptr natsjs.Pointer) bool {
	got, err := natsjs.ParsePointer(h)
	return err == nil && got == ptr
}

// errMoved: the pointer was refused because the frames subject's tail moved
// to a message the chain now goes on from (overtaken).
var errMoved = errors.New("natspub: the frames subject's tail moved under the snapshot pointer")

// restartable ends a retry loop with errRestart when the hub subscription
// ended without a clean shutdown (a lag) while NATS failed with err.
func (p *Publisher) restartable(sub *hub.Subscription, err error) error {
	if sub != nil && sub.Err() != nil && !p.closing(sub) {
		return fmt.Errorf("%w: hub subscription ended (%v) while NATS failed: %v", errRestart, sub.Err(), err)
	}
	return nil
}

// point publishes the snapshot pointer, expecting the chain's last message
// as the frames subject's last (Nats-Expected-Last-Subject-Sequence with
// Nats-Expected-Last-Subject-Sequence-Subject): only the publisher whose
// chain is the subject's tail moves it, so readers never load a deposed
// incarnation's snapshot once the new leader has published. A retry of a
// stored pointer is a duplicate (the frames subject did not move).
func (p *Publisher) point(ctx context.Context, sub *hub.Subscription, ptr natsjs.Pointer) error {
	p.n++
	id := natsjs.MsgID(ptr.Incarnation, ptr.Sequence, p.n)
	backoff := 20 * time.Millisecond
	for {
		if err := p.fenced(); err != nil {
			return err
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ack, err := p.js.PublishMsg(pctx, &nats.Msg{Subject: p.layout.Pointer, Header: ptr.Header()},
			jetstream.WithMsgID(id), jetstream.WithExpectLastSequenceForSubject(p.chain, p.layout.Subject))
		if err == nil && ack.Duplicate {
			if m, merr := p.msg(pctx, ack.Sequence); merr != nil || m.Subject != p.layout.Pointer || !samePointer(m.Header, ptr) {
				cancel()
				p.log.Warn("a message of another publisher holds the snapshot pointer's id", "id", id, "stream_seq", ack.Sequence)
				p.n++
				id = natsjs.MsgID(ptr.Incarnation, ptr.Sequence, p.n)
				continue
			}
		}
		var tail jsexpect.Tail
		var terr error
		refused := jsexpect.Classify(err) == jsexpect.Refused
		if refused {
			tail, terr = p.tail(pctx)
		}
		cancel()
		switch {
		case err == nil:
			return nil
		case refused && terr == nil:
			if err := p.overtaken(id, tail); err != nil {
				return err
			}
			return errMoved
		case ctx.Err() != nil:
			return ctx.Err()
		}
		p.count(func(s *Stats) { s.Retries++; s.LastError = err.Error() })
		if err := p.restartable(sub, err); err != nil {
			return err
		}
		if !sleep(ctx, &backoff) {
			return ctx.Err()
		}
	}
}

// clean deletes the snapshot objects of incarnations older than inc (and the
// single object of relays before the pointer), once this publisher's pointer
// names its own: the bucket holds the newest incarnation's object, plus at
// most the late object of a deposed publisher until the next chain's
// cleaning. Best effort, bounded: a failure leaves them for the next chain.
func (p *Publisher) clean(ctx context.Context, inc uint64) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	objs, err := p.obs.List(cctx)
	if err != nil {
		if !errors.Is(err, jetstream.ErrNoObjectsFound) {
			p.log.Warn("listing old snapshot objects", "err", err)
		}
		return
	}
	for _, o := range objs {
		old, ok := natsjs.SnapshotObjectIncarnation(o.Name)
		if ok && old >= inc || !ok && o.Name != natsjs.SnapshotObject {
			continue
		}
		if err := p.obs.Delete(cctx, o.Name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			p.log.Warn("deleting an old snapshot object", "object", o.Name, "err", err)
			return
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
		if err := p.publish(ctx, sub, &drain); err != nil {
			return err
		}
	}
	cl := wire.Frame{Kind: wire.KindClose, Close: wire.Close{Reason: reason, Message: fmt.Sprint(cause)}}
	return p.publish(ctx, sub, &cl)
}
