package dynamonats

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/catalog"
	"github.com/ckfrelay/ckfrelay/internal/source"
	"github.com/ckfrelay/ckfrelay/producer"
	"github.com/ckfrelay/ckfrelay/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Config configures one Dynamo NATS source.
type Config struct {
	// URL of the NATS server(s).
	URL string
	// Subject of the KV events, e.g. "namespace.dynamo.component.backend.kv-events"
	// (wildcards allowed: "namespace.dynamo.component.*.kv-events").
	Subject string
	// Stream and Durable, when set, consume the subject from a JetStream
	// stream with a durable consumer (created if missing) instead of core
	// NATS: events published while the relay was away are not lost.
	Stream, Durable string
	// SourceTimeout resets every member of a publisher silent for this long
	// (a worker that left). Zero disables it: Dynamo publishers do not
	// heartbeat on this subject, so only set it where workers do.
	SourceTimeout time.Duration
	// Options are extra NATS connection options.
	Options []nats.Option
	// Limits bound what one message may carry, as they bound an HTTP batch
	// (zero fields: DefaultLimits).
	Limits wire.BatchLimits
	// MaxMembers bounds the members (worker_id, dp_rank) the source tracks:
	// the events of a member past it are dropped and counted (Dropped,
	// LastError), so a flood of distinct worker ids costs bounded memory.
	// The relay sets the pool's max_members; zero means
	// ckf.DefaultMaxMembers.
	MaxMembers int
}

// Source is a running Dynamo NATS source.
type Source struct {
	cfg Config

	mu     sync.Mutex
	status source.Status
	// refused holds the members whose epoch the pool refuses for good
	// (errTerminal): while any is, the source reads failing, not live.
	refused map[ckf.Member]struct{}

	// Run's goroutine only.
	members map[ckf.Member]*memberState
	// resume: by member and publisher, the next envelope sequence the
	// group's records hold up to (Resume); taken at first contact.
	resume  map[resumeKey]uint64
	evs     []ckf.RouterEvent
	decided map[ckf.Member]decision // per message
}

type resumeKey struct {
	m         ckf.Member
	publisher uint64
}

// decision is what one message means for one member.
type decision struct {
	epoch uint64
	admit bool
}

// incoming is one message and how to settle it (JetStream: ack, nak or
// term).
type incoming struct {
	data   []byte
	settle func(settlement)
}

// settlement is what becomes of a JetStream message.
type settlement uint8

const (
	ack  settlement = iota // handled (admitted, dropped as old, or malformed)
	nak                    // not handled yet: redeliver (the sink was busy or stopping)
	term                   // never handleable: do not redeliver (a refused reset)
)

// errTerminal marks a message the sink refused for good: redelivering it
// would be refused again, forever.
var errTerminal = errors.New("dynamonats: message refused for good")

type memberState struct {
	publisher uint64 // publisher_id of the current lifetime
	epoch     uint64 // source epoch of that lifetime
	next      uint64 // next expected envelope sequence
	seen      time.Time
}

// New returns a source; it does nothing until Run.
func New(cfg Config) (*Source, error) {
	if cfg.URL == "" || cfg.Subject == "" {
		return nil, errors.New("dynamonats: url and subject are required")
	}
	if (cfg.Stream == "") != (cfg.Durable == "") {
		return nil, errors.New("dynamonats: stream and durable must be set together")
	}
	if cfg.Limits.MaxEvents <= 0 {
		cfg.Limits.MaxEvents = DefaultLimits.MaxEvents
	}
	if cfg.Limits.MaxBlocksPerEvent <= 0 {
		cfg.Limits.MaxBlocksPerEvent = DefaultLimits.MaxBlocksPerEvent
	}
	if cfg.MaxMembers <= 0 {
		cfg.MaxMembers = ckf.DefaultMaxMembers
	}
	name := "dynamo@" + cfg.Subject
	if cfg.Stream != "" {
		name += " (" + cfg.Stream + "/" + cfg.Durable + ")"
	}
	return &Source{cfg: cfg, members: map[ckf.Member]*memberState{}, decided: map[ckf.Member]decision{}, refused: map[ckf.Member]struct{}{},
		status: source.Status{Name: name, Engine: "dynamo", State: "connecting"}}, nil
}

var _ source.Source = (*Source)(nil)

// Status implements source.Source.
func (s *Source) Status() source.Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status
}

// connectedState is the state of a connected source: failing while the pool
// refuses some member's epoch, else live. s.mu is held.
func (s *Source) connectedState() string {
	if len(s.refused) > 0 {
		return source.StateFailing
	}
	return "live"
}

// setRefused records whether the pool refuses m's epoch and updates the
// state of a connected source.
func (s *Source) setRefused(m ckf.Member, refused bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, was := s.refused[m]
	if was == refused {
		return
	}
	if refused {
		s.refused[m] = struct{}{}
	} else {
		delete(s.refused, m)
	}
	if s.status.State == "live" || s.status.State == source.StateFailing {
		s.status.State = s.connectedState()
	}
}

func (s *Source) update(f func(*source.Status)) {
	s.mu.Lock()
	f(&s.status)
	s.mu.Unlock()
}

// Run implements source.Source: it connects (retrying), then admits every
// message's events until ctx ends.
func (s *Source) Run(ctx context.Context, sink source.Sink) error {
	defer s.update(func(st *source.Status) { st.State = "stopped" })
	opts := append([]nats.Option{nats.Name("ckfrelay-dynamo-source"), nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			s.update(func(st *source.Status) {
				st.State = "recovering"
				if err != nil {
					st.LastError = err.Error()
				}
			})
		}),
		// A reconnect is the relay's connection coming back, not an engine
		// restart: Restarts counts only new publisher lifetimes.
		nats.ReconnectHandler(func(*nats.Conn) {
			s.update(func(st *source.Status) { st.State = s.connectedState(); st.Reconnects++ })
		}),
	}, s.cfg.Options...)
	nc, err := nats.Connect(s.cfg.URL, opts...)
	if err != nil {
		return fmt.Errorf("dynamonats: %w", err)
	}
	defer nc.Close()
	msgs := make(chan incoming, 1024)
	var stop func()
	if s.cfg.Stream == "" {
		// Core NATS is at most once: a slow relay loses messages, which the
		// envelope sequence then shows as a gap.
		sub, err := nc.Subscribe(s.cfg.Subject, func(m *nats.Msg) {
			select {
			case msgs <- incoming{data: m.Data}:
			case <-ctx.Done():
			}
		})
		if err != nil {
			return fmt.Errorf("dynamonats: subscribe %s: %w", s.cfg.Subject, err)
		}
		stop = func() { _ = sub.Unsubscribe() }
		// The server has the subscription once a flush round-trips: only
		// then is the source live.
		if err := nc.FlushTimeout(10 * time.Second); err != nil {
			return fmt.Errorf("dynamonats: subscribe %s: %w", s.cfg.Subject, err)
		}
	} else {
		if stop, err = s.durable(ctx, nc, msgs); err != nil {
			return err
		}
	}
	var stopOnce sync.Once
	defer stopOnce.Do(stop)
	s.update(func(st *source.Status) { st.State = s.connectedState() })
	var tick <-chan time.Time
	if s.cfg.SourceTimeout > 0 {
		t := time.NewTicker(s.cfg.SourceTimeout / 4)
		defer t.Stop()
		tick = t.C
	}
	// JetStream messages handled but not yet acknowledged: they are
	// acknowledged together once what they admitted is durable.
	var acks []func(settlement)
	defer func() {
		if len(acks) == 0 {
			return
		}
		stopOnce.Do(stop)
		for _, a := range acks {
			a(nak)
		}
		_ = nc.FlushTimeout(time.Second)
	}()
	for {
		select {
		case m := <-msgs:
			err := s.handle(ctx, sink, m.data)
			if m.settle != nil {
				switch {
				case err == nil:
					acks = append(acks, m.settle)
				case errors.Is(err, errTerminal):
					m.settle(term) // redelivering it would be refused again
				default:
					m.settle(nak) // not admitted: JetStream redelivers it
				}
			}
			if len(acks) > 0 && (len(msgs) == 0 || len(acks) >= maxAckBatch) {
				acks = s.ackDurable(ctx, sink, acks)
			}
			if errors.Is(err, errTerminal) {
				s.update(func(st *source.Status) { st.Dropped++; st.LastError = err.Error() })
				continue
			}
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				s.update(func(st *source.Status) { st.LastError = err.Error() })
			}
		case now := <-tick:
			if err := s.expire(ctx, sink, now); err != nil && ctx.Err() != nil {
				return ctx.Err()
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// maxAckBatch bounds the messages acknowledged after one wait for
// durability: a busy consumer still acknowledges steadily (MaxAckPending is
// 4,096).
const maxAckBatch = 256

// DurableSink is a Sink that tells when what it admitted is durable: the
// relay gives its sources one when the pool has a data dir, and Durable
// returns once the pool's journal committed every command admitted before
// the call. The JetStream consumer acknowledges a message only after that
// (docs/ingest.md "When a message is acknowledged (JetStream)"), so a relay
// killed between admitting a message's events and committing them has the
// message redelivered, not lost.
type DurableSink interface {
	source.Sink
	Durable(ctx context.Context) error
}

// ackDurable acknowledges acks once the events they admitted are durable
// (at once when sink does not keep them) and returns acks emptied. When the
// wait fails the messages are naked; when it fails because the source is
// stopping they are returned, and Run naks them after it stopped consuming
// (a nak before would redeliver them to this very consumer): a relay
// replica that lost its leadership (issue #34) stops its sources while
// they wait, and what they hold goes to the next leader's source at once,
// not after AckWait.
func (s *Source) ackDurable(ctx context.Context, sink source.Sink, acks []func(settlement)) []func(settlement) {
	if ds, ok := sink.(DurableSink); ok {
		if err := ds.Durable(ctx); err != nil {
			if ctx.Err() != nil {
				return acks // Run naks them once it stopped consuming
			}
			s.update(func(st *source.Status) { st.LastError = err.Error() })
			for _, a := range acks {
				a(nak)
			}
			return acks[:0]
		}
	}
	for _, a := range acks {
		a(ack)
	}
	return acks[:0]
}

// durable binds (or creates) the durable pull consumer and feeds msgs.
func (s *Source) durable(ctx context.Context, nc *nats.Conn, msgs chan<- incoming) (func(), error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("dynamonats: %w", err)
	}
	var cons jetstream.Consumer
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		cons, err = js.CreateOrUpdateConsumer(cctx, s.cfg.Stream, jetstream.ConsumerConfig{
			Durable: s.cfg.Durable, FilterSubject: s.cfg.Subject, AckPolicy: jetstream.AckExplicitPolicy,
			DeliverPolicy: jetstream.DeliverAllPolicy, MaxAckPending: 4096,
			// A message handed to a pull request of a source that just
			// stopped (a relay restart) waits AckWait before redelivery;
			// duplicates are dropped by envelope sequence, so a short wait
			// costs little and a restarted relay resumes within seconds
			// instead of JetStream's default 30 s.
			AckWait: 5 * time.Second,
		})
		cancel()
		if err == nil {
			break
		}
		s.update(func(st *source.Status) { st.LastError = err.Error(); st.State = "connecting" })
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		// Redeliveries and duplicates are filtered by envelope sequence.
		in := incoming{data: m.Data(), settle: func(st settlement) {
			switch st {
			case ack:
				_ = m.Ack()
			case nak:
				_ = m.Nak()
			case term:
				_ = m.Term()
			}
		}}
		select {
		case msgs <- in:
		case <-ctx.Done():
			// Stopping: hand it back at once (a message delivered to
			// the pull request still open would otherwise wait AckWait).
			_ = m.Nak()
		}
	})
	if err != nil {
		return nil, fmt.Errorf("dynamonats: consume %s/%s: %w", s.cfg.Stream, s.cfg.Durable, err)
	}
	// Stopping waits (briefly) until the subscription is gone, so what Run
	// naks afterwards goes back to the stream, not to this consumer.
	return func() {
		cc.Stop()
		select {
		case <-cc.Closed():
		case <-time.After(2 * time.Second):
		}
	}, nil
}

// handle admits one message.
func (s *Source) handle(ctx context.Context, sink source.Sink, data []byte) error {
	env, evs, err := DecodeLimited(data, s.evs[:0], s.cfg.Limits)
	s.evs = evs[:0]
	now := time.Now()
	if err != nil {
		s.update(func(st *source.Status) { st.Rejected++; st.LastError = err.Error(); st.LastEvent = now })
		return nil // a malformed message is dropped, never retried
	}
	var admitted uint64
	clear(s.decided)
	for i := range evs {
		ev := &evs[i]
		d, seen := s.decided[ev.Member()]
		if !seen {
			// Every event of one envelope shares its sequence: decide once
			// per member and message.
			if _, known := s.members[ev.Member()]; !known && len(s.members) >= s.cfg.MaxMembers {
				s.decided[ev.Member()] = decision{}
				s.update(func(st *source.Status) {
					st.Dropped++
					st.LastError = fmt.Sprintf("worker %d rank %d dropped: the source already tracks max_members %d members",
						ev.WorkerID, ev.DPRank, s.cfg.MaxMembers)
				})
				continue
			}
			var err error
			if d.epoch, d.admit, err = s.admitOrder(ctx, sink, ev.Member(), env, now); err != nil {
				return err
			}
			s.decided[ev.Member()] = d
		}
		if !d.admit {
			continue
		}
		// One event per call: s.evs is reused by the next message. A
		// replicated pool's records carry how far the member's publisher
		// was admitted (Resume).
		var err error
		if cs, ok := sink.(source.CursorSink); ok {
			err = cs.AdmitEventsAt(ctx, d.epoch, []ckf.RouterEvent{*ev}, producer.Cursor{Source: cursorSource(ev.Member(), env.PublisherID), Seq: env.Sequence})
		} else {
			err = sink.AdmitEvents(ctx, d.epoch, []ckf.RouterEvent{*ev})
		}
		if err != nil {
			return err
		}
		admitted++
	}
	s.update(func(st *source.Status) { st.Batches++; st.Events += catalog.U64(admitted); st.LastEvent = now })
	return nil
}

// admitOrder decides, for one event of member m in env, whether to admit it
// and under which epoch: a new publisher resets the member first; a sequence
// gap resets it degraded; an old or repeated sequence is dropped.
func (s *Source) admitOrder(ctx context.Context, sink source.Sink, m ckf.Member, env Envelope, now time.Time) (uint64, bool, error) {
	st := s.members[m]
	if st == nil && s.resumed(sink, m, env, now) {
		// Taken up where the group's records end: a running member from
		// here on (its seen, next and gap cases below).
		st = s.members[m]
	}
	switch {
	case st == nil || st.publisher != env.PublisherID:
		epoch := uint64(now.UnixNano())
		if st != nil {
			var err error
			if epoch, err = s.reset(ctx, sink, max(epoch, st.epoch+1), m, false); err != nil {
				return 0, false, err
			}
			s.update(func(st *source.Status) { st.Resets++; st.Restarts++ })
		}
		s.members[m] = &memberState{publisher: env.PublisherID, epoch: epoch, next: env.Sequence, seen: now}
		st = s.members[m]
	case env.Enveloped && seqOrder(st, env.Sequence) < 0:
		// Seen before: a redelivery or a duplicate.
		s.update(func(st *source.Status) { st.Dropped++ })
		return 0, false, nil
	case env.Enveloped && seqOrder(st, env.Sequence) > 0:
		epoch, err := s.reset(ctx, sink, max(uint64(now.UnixNano()), st.epoch+1), m, true)
		if err != nil {
			return 0, false, err
		}
		s.update(func(s *source.Status) { s.Gaps++; s.Resets++ })
		st.epoch = epoch
	}
	// The pool owns the member's epochs (docs/ingest.md, "Source epochs"):
	// when its record is not the epoch this source would admit under — a
	// first contact with a member the pool already knows (one that came
	// back after source_timeout, or recovered from --data-dir after a
	// restart), or another writer's reset — the events would be refused as
	// an unannounced epoch, so a new epoch above both is announced first.
	// The reset also drops blocks of the earlier lifetime the source never
	// heard removed.
	if recorded, known := source.RecordedEpoch(sink, m); known && recorded != st.epoch {
		epoch, err := s.reset(ctx, sink, max(uint64(now.UnixNano()), st.epoch+1, recorded+1), m, false)
		if err != nil {
			return 0, false, err
		}
		s.update(func(s *source.Status) { s.Resets++ })
		st.epoch = epoch
	}
	if env.Enveloped {
		st.next = env.Sequence + 1 // 2^64−1 is followed by 0 (seqOrder)
	}
	st.seen = now
	return st.epoch, true, nil
}

// duplicateWindow is how far behind a member's next expected sequence a
// message may be and still be a duplicate or a redelivery, dropped:
// JetStream redelivers at most MaxAckPending (4,096) messages a publisher
// sent before the newest one delivered. A message farther behind is not
// one seen before but a sequence that went back — a forged envelope that
// moved the member far ahead, or a publisher that restarted its sequence
// under the same id — and is taken as a gap: a degraded reset, then the
// member follows the new sequence. Dropping it as a duplicate would drop
// every later message of the honest publisher too, silently and for good
// (one forged sequence of 2^62 did).
const duplicateWindow = 1 << 16

// seqOrder places seq against member st's next expected sequence: -1 seen
// before (a duplicate or redelivery: at most duplicateWindow behind), 0 the
// next one, +1 a gap (ahead, or farther behind). Distances are modulo 2^64,
// so a sequence that passed 2^64−1 and went on at 0 is no gap, and one from
// just before that wrap is behind.
func seqOrder(st *memberState, seq uint64) int {
	switch behind := st.next - seq; {
	case behind == 0:
		return 0
	case behind <= duplicateWindow:
		return -1
	}
	return 1
}

// reset resets member m at epoch, or — when the pool already holds a higher
// epoch for it (a bridge reset it over HTTP, or a restarted relay recovered
// a later one) — at one above the pool's, and returns the epoch used. A
// reset the pool refuses for good (an epoch past the ceiling) returns an
// errTerminal error: the message is dropped, counted and, on JetStream,
// terminated instead of redelivered forever.
func (s *Source) reset(ctx context.Context, sink source.Sink, epoch uint64, m ckf.Member, degraded bool) (uint64, error) {
	err := sink.ResetRank(ctx, epoch, m, degraded)
	var stale *producer.StaleSourceEpochError
	if errors.As(err, &stale) && stale.Current < producer.MaxSourceEpoch {
		epoch = stale.Current + 1 // adopt the pool's epoch
		err = sink.ResetRank(ctx, epoch, m, degraded)
	}
	switch {
	case err == nil:
		s.setRefused(m, false)
		return epoch, nil
	case errors.Is(err, producer.ErrStaleSourceEpoch), errors.Is(err, producer.ErrEpochOutOfRange):
		s.setRefused(m, true)
		return 0, fmt.Errorf("%w: reset of worker %d rank %d: %w", errTerminal, m.WorkerID, m.DPRank, err)
	}
	return 0, err
}

// expire resets every member silent for SourceTimeout.
func (s *Source) expire(ctx context.Context, sink source.Sink, now time.Time) error {
	for m, st := range s.members {
		if now.Sub(st.seen) < s.cfg.SourceTimeout {
			continue
		}
		epoch := max(uint64(now.UnixNano()), st.epoch+1)
		if err := sink.ResetRank(ctx, epoch, m, false); err != nil {
			return err
		}
		delete(s.members, m)
		s.setRefused(m, false)
		s.update(func(st *source.Status) { st.Resets++ })
	}
	return nil
}
