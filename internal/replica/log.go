package replica

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ckfrelay/ckfrelay/internal/jsexpect"
)

// The records stream. Every pool of a relay group appends to one subject of
// one replicated stream; each message expects, through
// Nats-Expected-Last-Subject-Sequence, the stream sequence of the message
// before it on that subject. The stream leader checks the expectation
// atomically with the store (nats-server v2.15.2
// server/jetstream_batching.go checkMsgHeadersPreClusteredProposal: it
// refuses while another message on the subject is in flight, and compares
// against the stored last sequence otherwise), so two writers cannot both
// extend the same predecessor: one of them is refused.

// DefaultStream is the records stream's name, DefaultSubjectPrefix the
// prefix of its subjects ("<prefix>.<pool>").
const (
	DefaultStream        = "CKFRELAY_HA"
	DefaultSubjectPrefix = "ckfrelay.ha"
)

// DefaultMaxMessage bounds one message's payload: the default NATS
// max_payload (1 MiB) less room for headers. A batch beyond it is split
// into fragments.
const DefaultMaxMessage = 1<<20 - 4096

// DefaultMaxBatch bounds an assembled batch a standby accepts (a rank
// replacement of ~16M blocks).
const DefaultMaxBatch = 256 << 20

var poolToken = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Subject returns the records subject of pool.
func Subject(prefix, pool string) (string, error) {
	if prefix == "" {
		prefix = DefaultSubjectPrefix
	}
	if !poolToken.MatchString(pool) {
		return "", fmt.Errorf("replica: pool %q must match %s", pool, poolToken)
	}
	return prefix + "." + pool, nil
}

// StreamConfig is the records stream's configuration.
type StreamConfig struct {
	Name          string // default DefaultStream
	SubjectPrefix string // default DefaultSubjectPrefix
	Replicas      int    // default 3
	// MaxBytes caps the stream (with DiscardNew: an append beyond it is
	// refused, never an old record dropped); 0 means no cap.
	MaxBytes int64
}

func (c StreamConfig) withDefaults() StreamConfig {
	if c.Name == "" {
		c.Name = DefaultStream
	}
	if c.SubjectPrefix == "" {
		c.SubjectPrefix = DefaultSubjectPrefix
	}
	if c.Replicas == 0 {
		c.Replicas = 3
	}
	return c
}

// EnsureStream creates the records stream, or checks the one that exists.
// It is never bounded by age, count or DiscardOld: if the last record of a
// pool could expire, the expected sequence of its subject would fall back
// to 0 and an empty replica's term record would succeed — total state
// loss. A pool's subject is purged only below a checkpoint.
//
// An existing stream is not rewritten: an operator's cap (MaxBytes, with
// DiscardNew) and deny flags (DenyPurge, which NATS never lets anyone
// lift) are theirs to set — every replica start used to overwrite them, and
// with DenyPurge set no replica could start at all. Only what the records
// rely on is checked, and a stream that breaks it is refused with the
// setting to change (ErrStreamConfig); a replica count below the
// configured one is raised, never lowered.
func EnsureStream(ctx context.Context, js jetstream.JetStream, c StreamConfig) (jetstream.Stream, error) {
	c = c.withDefaults()
	maxBytes := c.MaxBytes
	if maxBytes == 0 {
		maxBytes = -1
	}
	subjects := c.SubjectPrefix + ".>"
	cfg := jetstream.StreamConfig{
		Name:              c.Name,
		Subjects:          []string{subjects},
		Storage:           jetstream.FileStorage,
		Replicas:          c.Replicas,
		Retention:         jetstream.LimitsPolicy,
		Discard:           jetstream.DiscardNew,
		MaxAge:            0,
		MaxMsgs:           -1,
		MaxMsgsPerSubject: -1,
		MaxBytes:          maxBytes,
		MaxMsgSize:        -1,
		Duplicates:        2 * time.Minute,
		AllowDirect:       true,
		DenyDelete:        true,
	}
	s, err := openOrCreate(ctx,
		func(ctx context.Context) (jetstream.Stream, error) { return js.Stream(ctx, c.Name) },
		func(ctx context.Context) (jetstream.Stream, error) { return js.CreateStream(ctx, cfg) })
	if err != nil {
		return nil, fmt.Errorf("replica: records stream %s: %w", c.Name, err)
	}
	have := s.CachedInfo().Config
	if err := checkStream(have, subjects); err != nil {
		return nil, err
	}
	raised, err := raiseReplicas(ctx, js, have, c.Replicas)
	if err != nil {
		return nil, fmt.Errorf("replica: records stream %s: raising its replicas to %d: %w", c.Name, c.Replicas, err)
	}
	if raised != nil {
		s = raised
	}
	return s, nil
}

// ErrStreamConfig: an existing records stream is configured in a way the
// records cannot live with.
var ErrStreamConfig = errors.New("replica: the records stream's configuration loses records")

// checkStream checks an existing records stream against what the records
// rely on: every record of every pool kept until a checkpoint's purge, and
// duplicates detected across an append's retries.
func checkStream(have jetstream.StreamConfig, subjects string) error {
	bad := func(what string) error {
		return fmt.Errorf("%w: stream %s %s; change it (nats stream edit) or let the relay create the stream", ErrStreamConfig, have.Name, what)
	}
	switch {
	case !slices.Contains(have.Subjects, subjects):
		return bad(fmt.Sprintf("does not capture %q (subjects %v)", subjects, have.Subjects))
	case have.Retention != jetstream.LimitsPolicy:
		return bad("has retention " + have.Retention.String() + ", not limits")
	case have.MaxAge != 0:
		return bad(fmt.Sprintf("has max age %v: a pool's last record could expire", have.MaxAge))
	case have.MaxMsgs > 0 || have.MaxMsgsPerSubject > 0:
		return bad(fmt.Sprintf("has message limits (%d, %d per subject): a pool's records could be dropped", have.MaxMsgs, have.MaxMsgsPerSubject))
	case have.MaxBytes > 0 && have.Discard != jetstream.DiscardNew:
		return bad("caps its bytes with discard old: a pool's records could be dropped")
	case have.Duplicates < time.Second:
		return bad(fmt.Sprintf("has a duplicates window of %v: a retried append could be stored twice", have.Duplicates))
	}
	return nil
}

// ErrRefused: the stream refused an append's expected predecessor — another
// replica appended (a new term) or this one is behind. Re-read the tail;
// a record of another term means step down.
var ErrRefused = errors.New("replica: append refused: the subject moved past the expected record")

// Appender appends one leader's records to a pool's subject, each
// expecting the one before it.
type Appender struct {
	js         jetstream.JetStream
	stream     jetstream.Stream
	subject    string
	term       uint64
	last       uint64 // stream sequence of the last message on the subject
	maxMessage int
	buf        []byte
	// nonce makes this appender's message ids its own: the stream
	// deduplicates ids across all its subjects, so an id that anyone can
	// predict (term and position alone) let a foreign message published
	// under it first turn the leader's append into a "duplicate" that was
	// never stored — and its 202 into a lie.
	nonce string
}

// NewAppender returns the appender of term on subject of stream s, whose
// last message (the last record the new leader applied) is at stream
// sequence last. maxMessage bounds a message (0 means DefaultMaxMessage).
func NewAppender(js jetstream.JetStream, s jetstream.Stream, subject string, term, last uint64, maxMessage int) *Appender {
	if maxMessage <= 0 {
		maxMessage = DefaultMaxMessage
	}
	var n [8]byte
	_, _ = rand.Read(n[:]) // crypto/rand.Read never fails (Go 1.24+)
	return &Appender{js: js, stream: s, subject: subject, term: term, last: last, maxMessage: maxMessage,
		nonce: hex.EncodeToString(n[:])}
}

// Last is the stream sequence of the last message appended (or expected).
func (a *Appender) Last() uint64 { return a.last }

// Term appends the term record: the appender's term leads only once it
// succeeded.
func (a *Appender) Term(ctx context.Context, t TermRecord) error {
	if len(t.Node) > MaxTermName || len(t.Address) > MaxTermName {
		return fmt.Errorf("replica: a term record's node id (%d bytes) and address (%d bytes) must fit %d bytes each: no standby could read it",
			len(t.Node), len(t.Address), MaxTermName)
	}
	b := AppendHeader(a.buf[:0], Header{Type: TypeTerm, Term: a.term, Prev: a.last})
	b = AppendTerm(b, t)
	a.buf = b
	return a.publish(ctx, a.subject+".t"+strconv.FormatUint(a.term, 10)+"."+a.nonce, b)
}

// Append appends one batch: cmds after journal position, split into
// fragments that each fit a message. Its message ids name the subject (the
// stream deduplicates across all its subjects), the term, the appender's
// random nonce, the position and the fragment, so a retry after a timeout
// is a duplicate and nothing else is.
func (a *Appender) Append(ctx context.Context, position uint64, cmds []Command) error {
	body, err := AppendBatch(nil, position, cmds)
	if err != nil {
		return err
	}
	room := a.maxMessage - headerMax
	for frag := 0; ; frag++ {
		n := min(room, len(body))
		more := n < len(body)
		b := AppendHeader(a.buf[:0], Header{Type: TypeBatch, More: more, Term: a.term, Prev: a.last})
		b = append(b, body[:n]...)
		a.buf = b
		id := a.subject + ".b" + strconv.FormatUint(a.term, 10) + "." + a.nonce + "." + strconv.FormatUint(position, 10) + "." + strconv.Itoa(frag)
		if err := a.publish(ctx, id, b); err != nil {
			return err
		}
		body = body[n:]
		if !more {
			return nil
		}
	}
}

// publish publishes one message expecting a.last, retrying a timeout or a
// missing stream leader (NATS elections make them normal) with the same
// message id until ctx ends. A retry of a stored message comes back as a
// duplicate with the stored sequence (a clustered stream checks the id
// first), or is refused by its expectation (a standalone server checks
// that first, server/stream.go processJetStreamMsgWithBatch): then the tail
// is re-read, and if it is this very message, it was stored.
//
// A refusal deposes this leader only when the tail shows another message
// after a.last. A refusal while the subject has not visibly moved is not
// one: a replicated stream answers 10164 while any message on the subject
// is still being proposed (nats-server v2.15.2 server/jetstream_batching.go
// checkMsgHeadersPreClusteredProposal: expectedPerSubjectInProcess,
// inflight) — this very message, retried after its ack was lost in an
// election, or a rival's — and the tail may be read from a replica that has
// not applied the newest message yet. Retrying the same id settles it: it
// is stored (a duplicate), or the rival's message shows in the tail. The
// stream leader still checks every expectation, so a retry can never
// extend a moved subject; treating the transient answer as final made a
// healthy leader step down and rebuild whenever NATS re-elected.
func (a *Appender) publish(ctx context.Context, id string, data []byte) error {
	backoff := 10 * time.Millisecond
	for {
		msg := &nats.Msg{Subject: a.subject, Data: data, Header: nats.Header{}}
		ack, err := a.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(a.last), jetstream.WithMsgID(id))
		if err == nil && ack.Duplicate {
			err = a.checkDuplicate(ctx, id, ack.Sequence)
		}
		if err == nil {
			a.last = ack.Sequence
			return nil
		}
		if errors.Is(err, ErrForeignDuplicate) {
			return err
		}
		if jsexpect.Classify(err).Expectation() {
			tail, terr := jsexpect.ReadTail(ctx, a.stream, a.subject)
			switch {
			case terr == nil && tail.Stored(id, a.last):
				a.last = tail.Seq
				return nil
			case terr == nil && tail.Seq > a.last:
				return fmt.Errorf("%w (expected %d, the subject's last is %d): %v", ErrRefused, a.last, tail.Seq, err)
			}
			// The subject has not visibly moved, or the tail read came from
			// a replica behind the stream leader, or failed: retry below
			// (a subject that really moved shows in a later read; one that
			// lost records keeps refusing until ctx ends).
		} else if !retryable(err) {
			return fmt.Errorf("replica: append %s: %w", id, err)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("replica: append %s: %w (last answer: %v)", id, ctx.Err(), err)
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return fmt.Errorf("replica: append %s: %w", id, ctx.Err())
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// ErrForeignDuplicate: the stream answered an append as a duplicate of a
// message that is not this append's on this subject — a message published
// under the same id by something else. The append is not stored.
var ErrForeignDuplicate = errors.New("replica: append answered as a duplicate of a message that is not it")

// checkDuplicate checks that the message a duplicate answer names is this
// append's: on this subject, after the expected one, with this id.
func (a *Appender) checkDuplicate(ctx context.Context, id string, seq uint64) error {
	m, err := a.stream.GetMsg(ctx, seq)
	if err != nil {
		return fmt.Errorf("replica: append %s: reading the message a duplicate answer names (%d): %w", id, seq, err)
	}
	if m.Subject != a.subject || seq <= a.last || m.Header.Get(jetstream.MsgIDHeader) != id {
		return fmt.Errorf("%w: id %s names stream sequence %d on %s", ErrForeignDuplicate, id, seq, m.Subject)
	}
	return nil
}

const errCodeDuplicateInProcess = 10158

// retryable: the append may or may not have been stored, or no stream
// leader answered; the same message id settles it.
func retryable(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		// 10158: a message with this id is still being stored (nats-server
		// v2.15.2 server/jetstream_errors_generated.go); 503: no leader.
		return apiErr.ErrorCode == errCodeDuplicateInProcess || apiErr.Code == 503
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected)
}

// Tail returns the stream sequence of the last message on subject (0 when
// there is none).
func Tail(ctx context.Context, s jetstream.Stream, subject string) (uint64, error) {
	return lastSeq(s.GetLastMsgForSubject(ctx, subject))
}

// lastSeq is the sequence of a subject's last message read as m (0 when
// the subject has none).
func lastSeq(m *jetstream.RawStreamMsg, err error) (uint64, error) {
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return m.Sequence, nil
}

// Record is one complete record as a standby reads it: a term record or a
// batch, and the stream sequence of its last message.
type Record struct {
	Seq    uint64
	Term   uint64
	Leader *TermRecord // a term record
	Batch  *Batch      // a batch
	Bytes  int         // the payload bytes of its messages
}

// GapError: a message's predecessor is not the last message the standby
// applied — a record is missing (or the stream was purged above it).
type GapError struct {
	Seq, Prev, Applied uint64
}

func (e *GapError) Error() string {
	return fmt.Sprintf("replica: record at stream sequence %d follows %d, but %d was applied last", e.Seq, e.Prev, e.Applied)
}

// TermError: a record's term is not the one the chain allows (a batch of
// another term than the last term record's, or a term record that does not
// raise the term).
type TermError struct {
	Seq, Term, Current uint64
	IsTermRecord       bool
}

func (e *TermError) Error() string {
	return fmt.Sprintf("replica: record at stream sequence %d has term %d, the current term is %d (term record: %v)", e.Seq, e.Term, e.Current, e.IsTermRecord)
}

// Follower reads a pool's records in order from a stream sequence on and
// checks the chain: every message names its predecessor and a term the
// chain allows.
//
// It reads through a plain pull consumer it manages itself, not nats.go's
// ordered consumer: that one recreates a lost consumer with background
// contexts (10 s a request, retried) and its Next waits meanwhile whatever
// its context says (nats.go v1.55.0 jetstream/ordered.go reset and
// orderedSubscription.Next). When a NATS node died with the consumer on it,
// a standby sat there for tens of seconds, unable to catch up, take the
// lease or stop. Here every request runs under the caller's context.
type Follower struct {
	js      jetstream.JetStream
	stream  string
	subject string
	name    string // consumer name prefix; the serial completes it
	serial  int
	cons    jetstream.Consumer // nil when the next Next must (re)create it
	it      jetstream.MessagesContext
	dseq    uint64 // the consumer's delivery sequence of the last message
	resets  int    // consumers abandoned and recreated
	stalls  int    // of those, consumers that were silent with records to deliver
	// quietSince is when the consumer was created or last delivered a
	// message (or the last stall check found nothing to deliver).
	quietSince time.Time
	onStall    func(tail, applied uint64)
	applied    uint64 // stream sequence of the last message read
	term       uint64
	maxBatch   int
	asm        []byte
	asmOpen    bool
	asmBytes   int // payload bytes of the open batch's fragments
}

// followHeartbeat is the pull heartbeat: a consumer that died with its NATS
// node is noticed after two missed ones, and recreated.
const followHeartbeat = 500 * time.Millisecond

// followStallCheck is how long a follower waits on a silent consumer
// before it asks the stream's leader whether there is anything to read
// (one request per interval while the pool is idle).
const followStallCheck = 2 * time.Second

// followStallProbe is the least a read waits before a stall check, so
// that the messages a consumer delivered while nobody read are read first.
const followStallProbe = 100 * time.Millisecond

// followCreateTimeout bounds one attempt to create the consumer: a request
// placed on a node that just died is abandoned and retried, not waited out.
const followCreateTimeout = 2 * time.Second

// Follow starts reading subject of stream after stream sequence applied,
// at term (both 0 for an empty replica). maxBatch bounds an assembled batch
// (0 means DefaultMaxBatch). Stop it when done.
func Follow(ctx context.Context, js jetstream.JetStream, stream, subject string, applied, term uint64, maxBatch int) (*Follower, error) {
	if maxBatch <= 0 {
		maxBatch = DefaultMaxBatch
	}
	f := &Follower{js: js, stream: stream, subject: subject, name: "ckfrelay_follow_" + nats.NewInbox()[len(nats.InboxPrefix):],
		applied: applied, term: term, maxBatch: maxBatch}
	if err := f.open(ctx); err != nil {
		return nil, fmt.Errorf("replica: follow %s: %w", subject, err)
	}
	return f, nil
}

// open creates a consumer delivering the subject from the message after
// the last one read, and starts pulling from it.
func (f *Follower) open(ctx context.Context) error {
	f.serial++
	cctx, cancel := context.WithTimeout(ctx, followCreateTimeout)
	defer cancel()
	cons, err := f.js.CreateOrUpdateConsumer(cctx, f.stream, jetstream.ConsumerConfig{
		Name:          f.name + "_" + strconv.Itoa(f.serial),
		FilterSubject: f.subject,
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:   f.applied + 1,
		AckPolicy:     jetstream.AckNonePolicy,
		Replicas:      1,
		MemoryStorage: true,
		// A follower that vanished without Stop (a killed relay) leaves
		// its consumer behind until this.
		InactiveThreshold: time.Minute,
	})
	if err != nil {
		return err
	}
	// Short pulls with frequent heartbeats, and a missed heartbeat is an
	// error: a consumer that died with its NATS node is recreated within
	// about a second, not the defaults' 30 s.
	it, err := cons.Messages(jetstream.PullExpiry(2*time.Second), jetstream.PullHeartbeat(followHeartbeat),
		jetstream.WithMessagesErrOnMissingHeartbeat(true))
	if err != nil {
		f.deleteConsumer(cons)
		return err
	}
	f.cons, f.it, f.dseq = cons, it, 0
	f.quietSince = time.Now()
	return nil
}

// drop abandons the current consumer (its node may be gone: the delete
// runs in the background, bounded, and InactiveThreshold is the backstop).
func (f *Follower) drop() {
	if f.cons == nil {
		return
	}
	f.it.Stop()
	cons := f.cons
	f.cons, f.it = nil, nil
	f.resets++
	go f.deleteConsumer(cons)
}

func (f *Follower) deleteConsumer(cons jetstream.Consumer) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if info := cons.CachedInfo(); info != nil {
		_ = f.js.DeleteConsumer(ctx, f.stream, info.Name)
	}
}

// Stop ends the follower's subscription and deletes its consumer (the
// server's consumer limit counts it until then).
func (f *Follower) Stop() {
	if f.cons == nil {
		return
	}
	f.it.Stop()
	f.deleteConsumer(f.cons)
	f.cons, f.it = nil, nil
}

// Resets counts the consumers the follower abandoned and recreated.
func (f *Follower) Resets() int { return f.resets }

// Stalls counts the consumers the follower abandoned because they stayed
// silent while the subject had records for them.
func (f *Follower) Stalls() int { return f.stalls }

// next returns the next message of the subject after the last one read,
// recreating the consumer when it is lost (a missed heartbeat, a deleted
// consumer, a delivery gap), until ctx ends.
func (f *Follower) next(ctx context.Context) (jetstream.Msg, *jetstream.MsgMetadata, error) {
	backoff := time.Duration(0)
	for {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		if f.cons == nil {
			if backoff > 0 {
				select {
				case <-time.After(backoff):
				case <-ctx.Done():
					return nil, nil, ctx.Err()
				}
			}
			if err := f.open(ctx); err != nil {
				if ctx.Err() != nil {
					return nil, nil, ctx.Err()
				}
				backoff = min(max(2*backoff, 50*time.Millisecond), time.Second)
				continue
			}
		}
		// The silence is measured across calls: a standby cancels its
		// read every lease TTL (to try the lease) and a takeover's
		// catch-up lasts what is left of the lease, both shorter than
		// followStallCheck. The check follows a read that waited at least
		// followStallProbe for nothing, so what the consumer delivered
		// while nobody read is taken first, not mistaken for a stall.
		wait := max(followStallCheck-time.Since(f.quietSince), followStallProbe)
		wctx, cancel := context.WithTimeout(ctx, wait)
		msg, err := f.it.Next(jetstream.NextContext(wctx))
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil, ctx.Err()
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				f.drop()
				continue
			}
			if time.Since(f.quietSince) >= followStallCheck {
				f.quietSince = time.Now() // one check per interval while idle
				if f.stalled(ctx) {
					f.drop()
				}
			}
			continue
		}
		f.quietSince = time.Now()
		md, err := msg.Metadata()
		if err != nil {
			return nil, nil, err
		}
		if md.Sequence.Consumer != f.dseq+1 || md.Sequence.Stream <= f.applied {
			// Something between the consumer and us was lost: start over
			// after the last message read.
			f.drop()
			continue
		}
		f.dseq = md.Sequence.Consumer
		return msg, md, nil
	}
}

// stalled says whether the subject holds a message after the last one
// read, as the stream's leader answers: the consumer has been silent for
// followStallCheck although there is something to deliver. Heartbeats do
// not tell: a consumer whose NATS node is alive but whose replica of the
// stream is behind (catching up after another node died, or stuck) keeps
// sending them and delivers nothing, and the next consumer may well be
// placed on a current replica. A stream without a leader cannot say; the
// follower then keeps waiting on its consumer.
func (f *Follower) stalled(ctx context.Context) bool {
	tail, err := lastSeq(leaderGet(ctx, f.js.Conn(), f.stream, leaderGetRequest{LastFor: f.subject}))
	if err != nil || tail <= f.applied {
		return false
	}
	f.stalls++
	if f.onStall != nil {
		f.onStall(tail, f.applied)
	}
	return true
}

// OnStall sets fn to be called (on the reading goroutine) each time the
// follower abandons a consumer that stayed silent while the subject held
// records up to stream sequence tail after applied.
func (f *Follower) OnStall(fn func(tail, applied uint64)) { f.onStall = fn }

// Applied is the stream sequence of the last message read; Term the term
// of the last term record.
func (f *Follower) Applied() uint64 { return f.applied }

// Term is the current term: the last term record's.
func (f *Follower) Term() uint64 { return f.term }

// Next returns the next complete record, waiting for it until ctx ends. A
// *GapError, *TermError or ErrCorrupt means the chain is broken: the
// standby must rebuild its pool, not apply further.
func (f *Follower) Next(ctx context.Context) (Record, error) {
	for {
		msg, md, err := f.next(ctx)
		if err != nil {
			return Record{}, err
		}
		seq := md.Sequence.Stream
		m, err := DecodeMessage(msg.Data())
		if err != nil {
			return Record{}, fmt.Errorf("stream sequence %d: %w", seq, err)
		}
		if m.Prev != f.applied {
			return Record{}, &GapError{Seq: seq, Prev: m.Prev, Applied: f.applied}
		}
		switch m.Type {
		case TypeTerm:
			if m.Term <= f.term {
				return Record{}, &TermError{Seq: seq, Term: m.Term, Current: f.term, IsTermRecord: true}
			}
			// A batch left incomplete by a leader that died between its
			// fragments was never acknowledged (outputs wait for the whole
			// append): the new term drops it, as every replica does.
			f.asm, f.asmOpen, f.asmBytes = f.asm[:0], false, 0
			t, err := DecodeTerm(m.Body)
			if err != nil {
				return Record{}, fmt.Errorf("stream sequence %d: %w", seq, err)
			}
			f.applied, f.term = seq, m.Term
			return Record{Seq: seq, Term: m.Term, Leader: &t, Bytes: len(msg.Data())}, nil
		case TypeBatch:
			if m.Term != f.term {
				return Record{}, &TermError{Seq: seq, Term: m.Term, Current: f.term}
			}
			if len(f.asm)+len(m.Body) > f.maxBatch {
				return Record{}, fmt.Errorf("%w: a batch beyond %d bytes at stream sequence %d", ErrCorrupt, f.maxBatch, seq)
			}
			f.applied = seq
			f.asmBytes += len(msg.Data())
			if m.More {
				f.asm = append(f.asm, m.Body...)
				f.asmOpen = true
				continue
			}
			body := m.Body
			if f.asmOpen {
				body = append(f.asm, m.Body...)
			}
			size := f.asmBytes
			f.asm, f.asmOpen, f.asmBytes = f.asm[:0], false, 0
			b, err := DecodeBatch(body)
			if err != nil {
				return Record{}, fmt.Errorf("stream sequence %d: %w", seq, err)
			}
			return Record{Seq: seq, Term: m.Term, Batch: &b, Bytes: size}, nil
		}
	}
}
