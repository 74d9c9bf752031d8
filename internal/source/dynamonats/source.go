package dynamonats

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
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
	// AckWait is the JetStream consumer's acknowledgement wait (zero:
	// DefaultAckWait): a message another consumer instance received and
	// did not settle within it is redelivered.
	AckWait time.Duration
	// GapWait is how long, on JetStream, a hole in a publisher's sequence
	// is held open for the redelivery that fills it before it counts as a
	// gap (zero: 2 × AckWait: a message another consumer instance took
	// comes back after AckWait, plus at most pullExpiry while that one's
	// pull request lived). Core NATS never redelivers: there a hole is a
	// gap at once.
	GapWait time.Duration
}

// DefaultAckWait is the durable consumer's AckWait when Config.AckWait is
// zero. A message handed to the pull request of a source that just stopped
// (a relay restart, a replica deposed while frozen) waits AckWait before
// redelivery; duplicates are dropped by envelope sequence, so a short wait
// costs little and a restarted relay resumes within seconds instead of
// JetStream's default 30 s.
const DefaultAckWait = 5 * time.Second

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
	// publishers: the envelope sequence of each publisher heard, and its
	// members. Dynamo numbers a publisher's envelopes, not a member's: one
	// worker's publisher carries all its dp ranks on one sequence.
	publishers map[uint64]*publisherState
	// resume: what Resume took from the group's records — each
	// publisher's next sequence and each member's publisher — entered
	// when the publisher is first heard.
	resume  resumePoint
	evs     []ckf.RouterEvent
	decided map[ckf.Member]decision // per message
	// JetStream only: messages handled but not yet acknowledged, and
	// messages held ahead of a hole (reorder.go).
	acks []func(settlement)
	hold *holdBuffer
	// holdBounds are the hold buffer's bounds (maxHeldMessages,
	// maxHeldBytes; tests lower them).
	holdBounds [2]int
	// noStartReset and noRewind skip resetting the durable consumer to its
	// ack floor at start and for a hole (tests of the reorder window, as on
	// a server without the API).
	noStartReset, noRewind bool
	// rewind resets the durable consumer to its ack floor (nil on core
	// NATS); rewound is when a hole last made the source call it.
	rewind  func(context.Context) error
	rewound time.Time
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
	// streamSeq is the message's JetStream stream sequence (0 on core
	// NATS): a redelivery carries the same one, a second publication of
	// the same envelope another.
	streamSeq uint64
}

// settlement is what becomes of a JetStream message.
type settlement uint8

const (
	ack      settlement = iota // handled (admitted, dropped as old, or malformed)
	nak                        // not handled yet: redeliver (the sink was busy or stopping)
	term                       // never handleable: do not redeliver (a refused reset)
	progress                   // held: reset the redelivery timer (InProgress)
)

// errTerminal marks a message the sink refused for good: redelivering it
// would be refused again, forever.
var errTerminal = errors.New("dynamonats: message refused for good")

type memberState struct {
	publisher uint64 // publisher_id of the current lifetime
	epoch     uint64 // source epoch of that lifetime
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
	if cfg.AckWait <= 0 {
		cfg.AckWait = DefaultAckWait
	}
	if cfg.GapWait <= 0 {
		cfg.GapWait = 2 * cfg.AckWait
	}
	name := "dynamo@" + cfg.Subject
	if cfg.Stream != "" {
		name += " (" + cfg.Stream + "/" + cfg.Durable + ")"
	}
	return &Source{cfg: cfg, members: map[ckf.Member]*memberState{}, publishers: map[uint64]*publisherState{},
		decided: map[ckf.Member]decision{}, refused: map[ckf.Member]struct{}{},
		status:     source.Status{Name: name, Engine: "dynamo", State: "connecting"},
		holdBounds: [2]int{maxHeldMessages, maxHeldBytes}}, nil
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
	var tick, holdTick <-chan time.Time
	if s.cfg.SourceTimeout > 0 {
		t := time.NewTicker(s.cfg.SourceTimeout / 4)
		defer t.Stop()
		tick = t.C
	}
	if s.cfg.Stream != "" {
		// Held messages are told in progress every AckWait/2 at the latest,
		// and a hole is forced at most AckWait/4 past GapWait.
		s.hold = newHoldBuffer(s.holdBounds[0], s.holdBounds[1])
		t := time.NewTicker(min(s.cfg.AckWait/4, rewindAfter/3))
		defer t.Stop()
		holdTick = t.C
	}
	// What is neither acknowledged nor terminated when Run ends goes back
	// to the stream at once, once this consumer stopped pulling (a nak
	// before would redeliver it to this very consumer).
	defer func() {
		var back []func(settlement)
		if s.hold != nil {
			for _, hm := range s.hold.drain() {
				back = append(back, hm.settles...)
			}
			s.update(func(st *source.Status) { st.Held = 0 })
		}
		back = append(back, s.acks...)
		s.acks = nil
		if len(back) == 0 {
			return
		}
		stopOnce.Do(stop)
		for _, a := range back {
			a(nak)
		}
		_ = nc.FlushTimeout(time.Second)
	}()
	for {
		select {
		case m := <-msgs:
			var settles []func(settlement)
			if m.settle != nil {
				settles = []func(settlement){m.settle}
			}
			if err := s.deliver(ctx, sink, m.data, settles, m.streamSeq, false); err != nil {
				return err
			}
			if len(s.acks) > 0 && (len(msgs) == 0 || len(s.acks) >= maxAckBatch) {
				s.acks = s.ackDurable(ctx, sink, s.acks)
			}
		case now := <-holdTick:
			if err := s.holdTimers(ctx, sink, now); err != nil {
				return err
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

// deliver handles one message and settles it, then every held message
// its admission made next, in sequence order. On JetStream a message ahead
// of a hole is held instead (unless force: a hole that waited GapWait, or
// the buffer's bounds, make it a gap). It returns an error only when the
// source is stopping.
func (s *Source) deliver(ctx context.Context, sink source.Sink, data []byte, settles []func(settlement), streamSeq uint64, force bool) error {
	for data != nil {
		env, err := s.handle(ctx, sink, data, s.hold != nil && !force)
		force = false
		if ahead, ok := err.(*aheadError); ok {
			if !s.hold.add(ahead.key, data, settles, streamSeq, time.Now(), s.cfg.GapWait) {
				// Another message under a held envelope sequence: a
				// duplicate, handled (dropped) as one that arrives after
				// the first is admitted would be. Held, each copy would
				// take a slot of MaxAckPending until the hole closed.
				s.update(func(st *source.Status) { st.Dropped++ })
				return s.settle(ctx, nil, settles)
			}
			s.update(func(st *source.Status) { st.Held = s.hold.len() })
			// Past the bound the youngest hole pays, not the oldest: a
			// flood of fresh holes (anyone who may publish on the subject)
			// must not force an honest publisher's hole that a redelivery
			// is about to fill (red team D3: 74 acknowledged events lost).
			for s.hold.over() {
				if err := s.forceGap(ctx, sink, s.hold.youngest()); err != nil {
					return err
				}
			}
			return nil
		}
		if err := s.settle(ctx, err, settles); err != nil {
			return err
		}
		data, settles = nil, nil
		if err == nil && env.Enveloped && s.hold != nil && s.hold.len() > 0 {
			if hm := s.hold.take(holdKey{env.PublisherID, env.Sequence + 1}); hm != nil {
				data, settles, streamSeq = hm.data, hm.settles, hm.streamSeq
				s.update(func(st *source.Status) { st.Reordered++; st.Held = s.hold.len() })
			}
		}
	}
	return nil
}

// settle settles the deliveries of a message handle returned err for and
// records the outcome; it returns ctx's error when the source is stopping.
func (s *Source) settle(ctx context.Context, err error, settles []func(settlement)) error {
	for _, a := range settles {
		switch {
		case err == nil:
			s.acks = append(s.acks, a) // acknowledged once durable (ackDurable)
		case errors.Is(err, errTerminal):
			a(term) // redelivering it would be refused again
		default:
			a(nak) // not admitted: JetStream redelivers it
		}
	}
	switch {
	case err == nil:
	case errors.Is(err, errTerminal):
		s.update(func(st *source.Status) { st.Dropped++; st.LastError = err.Error() })
	case ctx.Err() != nil:
		return ctx.Err()
	default:
		s.update(func(st *source.Status) { st.LastError = err.Error() })
	}
	return nil
}

// forceGap makes the hole before held message hm's a gap: the message of
// hm's publisher least ahead is admitted after a degraded reset of the
// publisher's members, and the held messages after it follow.
func (s *Source) forceGap(ctx context.Context, sink source.Sink, hm *heldMsg) error {
	if next, ok := s.expectedNext(hm.key.publisher); ok {
		if low := s.hold.lowest(hm.key.publisher, next); low != nil {
			hm = low
		}
	}
	s.hold.take(hm.key)
	s.update(func(st *source.Status) { st.Held = s.hold.len() })
	return s.deliver(ctx, sink, hm.data, hm.settles, hm.streamSeq, true)
}

// holdTimers keeps held messages from being redelivered while they wait
// (InProgress every AckWait/2), rewinds the consumer for a hole open
// rewindAfter, and forces every hole open past GapWait.
func (s *Source) holdTimers(ctx context.Context, sink source.Sink, now time.Time) error {
	for _, hm := range s.hold.stale(now.Add(-s.cfg.AckWait/2), now) {
		for _, a := range hm.settles {
			a(progress)
		}
	}
	// A hole open longer than a pull request lives is a message another
	// reader of the durable took (a frozen leader whose last pull request
	// outlived the takeover's reset) or one this source naked: resetting
	// the consumer to its ack floor brings it back now, not AckWait later.
	// What comes back twice is dropped by envelope sequence (or joins its
	// held self). At most once per AckWait.
	if opened, ok := s.hold.opened(s.cfg.GapWait); ok && s.rewind != nil && !s.noRewind && now.Sub(opened) >= rewindAfter &&
		now.Sub(s.rewound) >= s.cfg.AckWait {
		s.rewound = now
		if err := s.rewind(ctx); err != nil {
			s.update(func(st *source.Status) { st.LastError = "reset to the ack floor: " + err.Error() })
		}
	}
	for {
		hm := s.hold.expired(now)
		if hm == nil {
			return nil
		}
		if err := s.forceGap(ctx, sink, hm); err != nil {
			return err
		}
	}
}

// maxAckBatch bounds the messages acknowledged after one wait for
// durability: a busy consumer still acknowledges steadily.
const maxAckBatch = 256

// maxAckPending is the durable consumer's MaxAckPending: the messages
// delivered and not yet acknowledged, held ones included. It also bounds
// how far a redelivery can be behind the newest message delivered, so how
// far ahead of a hole a message is held (aheadOf).
const maxAckPending = 4096

// pullExpiry is how long one pull request of the durable consumer lives
// (nats.go's least).
const pullExpiry = time.Second

// rewindAfter is how long a hole stays open before the source resets the
// consumer to its ack floor: past any other reader's last pull request.
const rewindAfter = pullExpiry + 500*time.Millisecond

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
			DeliverPolicy: jetstream.DeliverAllPolicy, MaxAckPending: maxAckPending,
			AckWait: s.cfg.AckWait,
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
	s.rewind = func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := js.ResetConsumer(ctx, s.cfg.Stream, s.cfg.Durable)
		return err
	}
	if !s.noStartReset {
		// Start from the consumer's ack floor: what the durable's previous
		// reader (a relay that died, or a replica deposed while frozen) was
		// handed and never acknowledged comes back at once and in stream
		// order, instead of AckWait later behind everything published since
		// — holes that each hold the member's later messages (reorder.go)
		// and, at a fleet's rate, overflowed the hold bound (red team
		// R-D1). Messages past the floor the pool already admitted are
		// dropped by envelope sequence. A server without the reset API
		// (an older nats-server) leaves it to redelivery and the
		// reorder window.
		if err := s.rewind(ctx); err != nil {
			s.update(func(st *source.Status) { st.LastError = "reset to the ack floor: " + err.Error() })
		}
	}
	// Each pull request lives pullExpiry: the server hands messages to
	// the open pull requests in turn, so a relay frozen with one open
	// (SIGSTOP, a paused VM: a deposed leader) would take every other
	// message for up to nats.go's default 30 s, each back only after
	// AckWait — holes the next leader's source cannot wait out. With it a
	// frozen consumer takes messages for at most this long.
	cc, err := cons.Consume(func(m jetstream.Msg) {
		// Redeliveries and duplicates are filtered by envelope sequence.
		var streamSeq uint64
		if md, err := m.Metadata(); err == nil {
			streamSeq = md.Sequence.Stream
		}
		in := incoming{data: m.Data(), streamSeq: streamSeq, settle: func(st settlement) {
			switch st {
			case ack:
				_ = m.Ack()
			case nak:
				_ = m.Nak()
			case term:
				_ = m.Term()
			case progress:
				_ = m.InProgress()
			}
		}}
		select {
		case msgs <- in:
		case <-ctx.Done():
			// Stopping: hand it back at once (a message delivered to
			// the pull request still open would otherwise wait AckWait).
			_ = m.Nak()
		}
	}, jetstream.PullExpiry(pullExpiry))
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

// aheadError is handle's answer for a message held ahead of a hole.
type aheadError struct{ key holdKey }

func (e *aheadError) Error() string {
	return fmt.Sprintf("dynamonats: publisher %d sequence %d is ahead of its next", e.key.publisher, e.key.seq)
}

// handle admits one message and returns its envelope. With hold, a message
// ahead of a hole in its publisher's sequence admits nothing and returns an
// *aheadError.
func (s *Source) handle(ctx context.Context, sink source.Sink, data []byte, hold bool) (Envelope, error) {
	env, evs, err := DecodeLimited(data, s.evs[:0], s.cfg.Limits)
	s.evs = evs[:0]
	now := time.Now()
	if err != nil {
		s.update(func(st *source.Status) { st.Rejected++; st.LastError = err.Error(); st.LastEvent = now })
		return env, nil // a malformed message is dropped, never retried
	}
	if hold && s.aheadOf(env) {
		return env, &aheadError{key: holdKey{env.PublisherID, env.Sequence}}
	}
	admit, err := s.order(ctx, sink, env, now)
	if err != nil || !admit {
		return env, err
	}
	defer s.forgetIdle(env.PublisherID)
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
			if d.epoch, err = s.memberEpoch(ctx, sink, ev.Member(), env, now); err != nil {
				return env, err
			}
			d.admit = true
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
			return env, err
		}
		admitted++
	}
	s.update(func(st *source.Status) { st.Batches++; st.Events += catalog.U64(admitted); st.LastEvent = now })
	return env, nil
}

// order decides what env means for its publisher's sequence: seen before
// (a redelivery or a duplicate: dropped), the next one, or one past a hole —
// envelopes of the publisher were lost, and since they may have carried
// any of its members, each is reset degraded before env is admitted.
func (s *Source) order(ctx context.Context, sink source.Sink, env Envelope, now time.Time) (bool, error) {
	if !env.Enveloped {
		return true, nil
	}
	ps := s.publishers[env.PublisherID]
	if ps == nil {
		ps = s.resumed(sink, env.PublisherID, now)
	}
	if ps == nil {
		s.publishers[env.PublisherID] = &publisherState{next: env.Sequence + 1, members: map[ckf.Member]struct{}{}}
		return true, nil
	}
	switch seqOrder(ps.next, env.Sequence) {
	case -1:
		s.update(func(st *source.Status) { st.Dropped++ })
		return false, nil
	case 1:
		members := slices.SortedFunc(maps.Keys(ps.members), func(a, b ckf.Member) int {
			return cmp.Or(cmp.Compare(a.WorkerID, b.WorkerID), cmp.Compare(a.DPRank, b.DPRank))
		})
		for _, m := range members {
			st := s.members[m]
			epoch, err := s.reset(ctx, sink, max(uint64(now.UnixNano()), st.epoch+1), m, true)
			if err != nil {
				return false, err
			}
			st.epoch = epoch
			s.update(func(s *source.Status) { s.Resets++ })
		}
		s.update(func(s *source.Status) { s.Gaps++ })
	}
	ps.next = env.Sequence + 1 // 2^64−1 is followed by 0 (seqOrder)
	return true, nil
}

// memberEpoch returns the epoch member m's events in env are admitted
// under: a member heard from another publisher before is a restarted
// engine, reset first; a member the pool records at another epoch is
// announced at a new one.
func (s *Source) memberEpoch(ctx context.Context, sink source.Sink, m ckf.Member, env Envelope, now time.Time) (uint64, error) {
	st := s.members[m]
	if st == nil || st.publisher != env.PublisherID {
		epoch := uint64(now.UnixNano())
		if st != nil {
			var err error
			if epoch, err = s.reset(ctx, sink, max(epoch, st.epoch+1), m, false); err != nil {
				return 0, err
			}
			s.update(func(st *source.Status) { st.Resets++; st.Restarts++ })
			s.leave(m, st.publisher)
		}
		st = &memberState{publisher: env.PublisherID, epoch: epoch}
		s.members[m] = st
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
			return 0, err
		}
		s.update(func(s *source.Status) { s.Resets++ })
		st.epoch = epoch
	}
	if ps := s.publishers[env.PublisherID]; ps != nil {
		ps.members[m] = struct{}{}
	}
	st.seen = now
	return st.epoch, nil
}

// leave takes member m off publisher's members, and forgets a publisher
// left without any.
func (s *Source) leave(m ckf.Member, publisher uint64) {
	if ps := s.publishers[publisher]; ps != nil {
		delete(ps.members, m)
		s.forgetIdle(publisher)
	}
}

// forgetIdle forgets publisher when it has no member (every event of its
// message was dropped, or its members left): publishers stay bounded by
// members, which max_members bounds.
func (s *Source) forgetIdle(publisher uint64) {
	if ps := s.publishers[publisher]; ps != nil && len(ps.members) == 0 {
		delete(s.publishers, publisher)
	}
}

// duplicateWindow is how far behind a publisher's next expected sequence a
// message may be and still be a duplicate or a redelivery, dropped:
// JetStream redelivers at most MaxAckPending (4,096) messages a publisher
// sent before the newest one delivered. A message farther behind is not
// one seen before but a sequence that went back — a forged envelope that
// moved the member far ahead, or a publisher that restarted its sequence
// under the same id — and is taken as a gap: a degraded reset, then the
// publisher's members follow the new sequence. Dropping it as a duplicate would drop
// every later message of the honest publisher too, silently and for good
// (one forged sequence of 2^62 did).
const duplicateWindow = 1 << 16

// seqOrder places seq against next, a publisher's next expected sequence: -1 seen
// before (a duplicate or redelivery: at most duplicateWindow behind), 0 the
// next one, +1 a gap (ahead, or farther behind). Distances are modulo 2^64,
// so a sequence that passed 2^64−1 and went on at 0 is no gap, and one from
// just before that wrap is behind.
func seqOrder(next, seq uint64) int {
	switch behind := next - seq; {
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
		s.leave(m, st.publisher)
		s.setRefused(m, false)
		s.update(func(st *source.Status) { st.Resets++ })
	}
	return nil
}
