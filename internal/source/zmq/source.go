package zmq

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/zeebo/xxh3"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/catalog"
	"github.com/ckfrelay/ckfrelay/internal/source"
	"github.com/ckfrelay/ckfrelay/producer"
)

// Rank states, as [source.RankStatus] reports them.
const (
	RankLive     = "live"     // exact: every batch since the epoch began was applied
	RankDegraded = "degraded" // reset after a gap nothing could fill; exact again after a Cleared or a restart
	RankReset    = "reset"    // reset after silence; rebuilt from the replay buffer when the engine speaks again
)

// Transition reasons (log lines, RankStatus.Reason).
const (
	reasonJoined      = "joined mid-stream"
	reasonGap         = "sequence gap"
	reasonNoReplay    = "no replay endpoint"
	reasonOverrun     = "replay buffer overrun"
	reasonReplayErr   = "replay failed"
	reasonRestart     = "engine restart"
	reasonSilent      = "silent past source_timeout"
	reasonReconnect   = "reconnected"
	reasonEpochRaised = "epoch raised by another writer"
)

// Rejection reasons of the source itself (the decoder's are in decode.go).
const (
	// ReasonRanks: a batch of a data-parallel rank beyond the source's
	// ranks (dp_ranks, or DefaultMaxRanks).
	ReasonRanks Reason = "ranks"
)

// recentBatches is how many applied batches' payload digests a rank keeps to
// tell a duplicate from an engine restart.
const recentBatches = 1024

// Source is one ZMQ source. Create it with [New]; Run it once at a time.
type Source struct {
	cfg Config
	log *slog.Logger
	dec *Decoder
	cv  Converter

	// Owned by Run's goroutine.
	ranks    map[uint32]*rank
	resume   map[uint32]int64 // Resume: the next Run's ranks, by the last sequence admitted
	maxRanks int
	eventID  uint64

	mu            sync.Mutex
	st            source.Status
	lastRefuseLog time.Time
	connected     int    // sockets connected (bind: listening); guarded by mu
	health        health // what could not be used (health.go); guarded by mu
	notLive       int    // ranks whose published state is not live; guarded by mu
	failingRanks  int    // ranks published as failing; guarded by mu

	logs logLimiter // thins the recovery lines (logs.go)
}

// rank is the per-DP-rank state of the stream.
type rank struct {
	member   ckf.Member
	replayEP string // "" when the engine has no replay socket
	cursor   string // the rank's stream in cursors (cursorSource), named on first use
	epoch    uint64 // source epoch of the member (1 on first contact)
	synced   bool   // next is meaningful: the pool holds this rank's stream up to next-1
	fresh    bool   // nothing admitted at epoch yet
	next     int64
	// ended: the rank applied sequence 2^63-1, the last of the sequence
	// space, so next stands for 2^63 (above every valid sequence): any
	// later batch is a duplicate or a new publisher lifetime, never a gap.
	ended     bool
	publisher []byte
	lastHeard time.Time
	state     string
	reason    string
	recent    [recentBatches]struct {
		seq    int64
		digest uint64
	}
	// known holds the block hashes admitted since a degraded reset, so a
	// Stored event whose parent was lost is dropped instead of faulting the
	// pool. nil while the rank is exact.
	known map[uint64]struct{}
	// failing: the pool refused the rank's epoch; retried on each message.
	failing bool
	// idx is the rank's entry in Status().Ranks (sorted by DP rank);
	// pubNotLive and pubFailing what that entry last said.
	idx                    int
	pubNotLive, pubFailing bool
}

func (r *rank) remember(seq int64, payload []byte) {
	e := &r.recent[uint64(seq)%recentBatches]
	e.seq, e.digest = seq, xxh3.Hash(payload)
}

func (r *rank) isDuplicate(seq int64, payload []byte) bool {
	e := r.recent[uint64(seq)%recentBatches]
	return e.seq == seq && e.digest == xxh3.Hash(payload) && e.digest != 0
}

// New validates cfg and returns a source.
func New(cfg Config) (*Source, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	maxRanks := DefaultMaxRanks
	if cfg.DPRanks > 0 {
		maxRanks = cfg.DPRanks
	}
	cfg = cfg.withDefaults()
	s := &Source{cfg: cfg, maxRanks: maxRanks, log: cfg.Logger.With("source", cfg.Name()), dec: NewDecoder(cfg.Limits),
		cv: newConverter(cfg), ranks: map[uint32]*rank{}}
	s.st = source.Status{Name: cfg.Name(), Engine: cfg.Engine, State: "connecting"}
	return s, nil
}

// Config returns the source's configuration, defaults filled in.
func (s *Source) Config() Config { return s.cfg }

// Status reports the source's health.
func (s *Source) Status() source.Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	st.Ranks = append([]source.RankStatus(nil), s.st.Ranks...)
	st.RejectedByReason = maps.Clone(s.st.RejectedByReason)
	st.DroppedByReason = maps.Clone(s.st.DroppedByReason)
	s.overlayHealthLocked(&st, time.Now())
	return st
}

func (s *Source) update(f func(st *source.Status)) {
	s.mu.Lock()
	f(&s.st)
	s.mu.Unlock()
}

// stateLocked derives the source's state from its connections and ranks.
func (s *Source) stateLocked() string {
	switch {
	case s.connected == 0:
		return "connecting"
	case s.failingRanks > 0:
		return StateFailing
	case s.notLive > 0:
		return "degraded"
	}
	return "live"
}

// publishRank copies r into its status entry and derives the state: O(1)
// per message, whatever the number of ranks.
func (s *Source) publishRank(r *rank) {
	last := r.next - 1
	if r.ended {
		last = r.next
	}
	rs := source.RankStatus{DPRank: r.member.DPRank, State: r.state, Epoch: catalog.U64(r.epoch),
		Seq: catalog.I64(last), Reason: r.reason, Publisher: hex.EncodeToString(r.publisher)}
	notLive := r.state != RankLive
	s.mu.Lock()
	s.st.Ranks[r.idx] = rs
	s.notLive += b2i(notLive) - b2i(r.pubNotLive)
	s.failingRanks += b2i(r.failing) - b2i(r.pubFailing)
	r.pubNotLive, r.pubFailing = notLive, r.failing
	s.st.State = s.stateLocked()
	s.mu.Unlock()
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// addRank enters a new rank in the status, kept sorted by DP rank (rare:
// at most maxRanks times).
func (s *Source) addRank(r *rank) {
	s.ranks[r.member.DPRank] = r
	s.mu.Lock()
	s.st.Ranks = append(s.st.Ranks, source.RankStatus{DPRank: r.member.DPRank, State: RankLive})
	slices.SortFunc(s.st.Ranks, func(a, b source.RankStatus) int { return cmp.Compare(a.DPRank, b.DPRank) })
	for i, e := range s.st.Ranks {
		s.ranks[e.DPRank].idx = i
	}
	s.mu.Unlock()
}

// inbound is one message read by a socket goroutine.
type inbound struct {
	socket int // connect mode: the socket's rank; bind mode: -1
	frames [][]byte
	// first marks the first message of a (re)connection: the engine may
	// have restarted meanwhile, so its continuity is checked.
	first bool
}

// Run subscribes and drives sink until ctx ends (it returns nil then) or
// the sink refuses events for good (it returns that error).
func (s *Source) Run(ctx context.Context, sink source.Sink) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	msgs := make(chan inbound, 4096)
	var wg sync.WaitGroup
	if s.cfg.Bind != "" {
		wg.Go(func() { s.listenLoop(ctx, msgs) })
	} else {
		for i := range s.cfg.DPRanks {
			ep, _ := RankEndpoint(s.cfg.Endpoint, i)
			wg.Go(func() { s.dialLoop(ctx, i, ep, msgs) })
		}
	}
	defer wg.Wait()
	defer s.update(func(st *source.Status) { st.State = "stopped" })
	s.resumeRanks(sink)
	tick := time.NewTicker(max(s.cfg.SourceTimeout/4, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-msgs:
			if err := s.handle(ctx, sink, m); err != nil && !isEpochRefusal(err) {
				if ctx.Err() != nil {
					return nil
				}
				s.update(func(st *source.Status) { st.LastError = err.Error() })
				return err
			}
		case now := <-tick.C:
			if err := s.checkSilence(ctx, sink, now); err != nil && !isEpochRefusal(err) {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
		}
	}
}

// zmqLogger silences the library's own log lines; the source logs the
// transitions that matter.
var zmqLogger = log.New(io.Discard, "", 0)

// dialLoop keeps one SUB socket connected to ep, redialling with
// exponential backoff (reset by a connection that delivered a message).
func (s *Source) dialLoop(ctx context.Context, rankIdx int, ep string, out chan<- inbound) {
	backoff := s.cfg.MinBackoff
	for ctx.Err() == nil {
		sub := zmq4.NewSub(s.guarded(ctx, zmq4.Sub), zmq4.WithDialerMaxRetries(0), zmq4.WithAutomaticReconnect(false),
			zmq4.WithDialerTimeout(s.cfg.ReplayTimeout), zmq4.WithLogger(zmqLogger))
		_ = sub.SetOption(zmq4.OptionSubscribe, s.cfg.Topic)
		if err := sub.Dial(subEndpoint(ep)); err != nil {
			_ = sub.Close()
			s.update(func(st *source.Status) { st.LastError = err.Error() })
			s.log.Debug("zmq source: dial failed; retrying", "endpoint", ep, "backoff", backoff, "err", err)
			if !sleep(ctx, backoff) {
				return
			}
			backoff = min(2*backoff, s.cfg.MaxBackoff)
			continue
		}
		s.log.Info("zmq source: connected", "endpoint", ep, "rank", rankIdx)
		s.update(func(st *source.Status) {
			s.connected++
			st.State = s.stateLocked()
		})
		healthy := false
		for {
			msg, err := sub.Recv()
			if err != nil {
				if ctx.Err() == nil {
					s.logs.log(s.log, slog.LevelWarn, "zmq source: disconnected; redialling", "endpoint", ep, "err", err)
					s.update(func(st *source.Status) { st.Reconnects++; st.LastError = err.Error() })
				}
				s.update(func(st *source.Status) {
					s.connected--
					st.State = s.stateLocked()
				})
				break
			}
			first := !healthy
			if !healthy {
				healthy, backoff = true, s.cfg.MinBackoff
			}
			select {
			case out <- inbound{socket: rankIdx, frames: msg.Frames, first: first}:
			case <-ctx.Done():
			}
		}
		_ = sub.Close()
		if !sleep(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, s.cfg.MaxBackoff)
	}
}

// listenLoop binds one SUB socket that engines connect to; a peer's
// disconnect is not an error of the socket.
func (s *Source) listenLoop(ctx context.Context, out chan<- inbound) {
	backoff := s.cfg.MinBackoff
	for ctx.Err() == nil {
		sub := zmq4.NewSub(s.guarded(ctx, zmq4.Sub), zmq4.WithAutomaticReconnect(false), zmq4.WithLogger(zmqLogger))
		_ = sub.SetOption(zmq4.OptionSubscribe, s.cfg.Topic)
		if err := sub.Listen(subEndpoint(s.cfg.Bind)); err != nil {
			_ = sub.Close()
			s.update(func(st *source.Status) { st.LastError = err.Error() })
			s.log.Warn("zmq source: bind failed; retrying", "bind", s.cfg.Bind, "backoff", backoff, "err", err)
			if !sleep(ctx, backoff) {
				return
			}
			backoff = min(2*backoff, s.cfg.MaxBackoff)
			continue
		}
		s.log.Info("zmq source: listening", "bind", s.cfg.Bind)
		s.update(func(st *source.Status) { s.connected++; st.State = s.stateLocked() })
		for ctx.Err() == nil {
			msg, err := sub.Recv()
			if err != nil {
				continue // one engine went away; the socket keeps listening
			}
			select {
			case out <- inbound{socket: -1, frames: msg.Frames}:
			case <-ctx.Done():
			}
		}
		_ = sub.Close()
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// guarded returns ctx carrying the source's peer guard for a socket of
// type own (transport.go).
func (s *Source) guarded(ctx context.Context, own zmq4.SocketType) context.Context {
	return withGuard(ctx, peerGuard{own: own,
		limits:    frameLimits{MaxMessage: uint64(s.cfg.MaxMessageBytes), MaxFrames: MaxFramesPerMessage},
		handshake: s.cfg.HandshakeTimeout, maxPeers: s.cfg.MaxPeers, perClient: s.cfg.MaxPeersPerClient,
		refuse: s.refusePeer})
}

// refusePeer counts a connection the transport dropped for its peer's fault.
func (s *Source) refusePeer(err error) {
	s.mu.Lock()
	s.st.PeersRefused++
	s.st.LastError = err.Error()
	logNow := time.Since(s.lastRefuseLog) >= rejectLogEvery
	if logNow {
		s.lastRefuseLog = time.Now()
	}
	s.mu.Unlock()
	if logNow {
		s.log.Warn("zmq source: dropped a peer", "err", err)
	}
}

// rejectLogEvery rate-limits rejection log lines per source.
const rejectLogEvery = time.Second

func (s *Source) reject(err error, seq int64, payload []byte) {
	var de *DecodeError
	reason := Reason("unknown")
	if errors.As(err, &de) {
		reason = de.Reason
	}
	s.mu.Lock()
	s.st.Rejected++
	s.st.LastError = err.Error()
	logNow := s.noteReject(reason, payload) // one line per reason per reasonLogEvery
	s.mu.Unlock()
	if logNow {
		s.log.Warn("zmq source: rejected a batch", "reason", string(reason), "seq", seq, "err", err, "payload", excerpt(payload))
	}
}

// handle processes one received message.
func (s *Source) handle(ctx context.Context, sink source.Sink, in inbound) error {
	msg, err := ParseMessage(in.frames)
	if err != nil {
		s.reject(err, -1, nil)
		return nil
	}
	b, err := s.dec.DecodeBatch(msg.Payload)
	if err != nil {
		s.reject(err, msg.Seq, msg.Payload)
		return nil
	}
	dp := uint32(max(in.socket, 0))
	if b.HasDPRank {
		dp = b.DPRank
	}
	r := s.ranks[dp]
	if r == nil {
		// By value, not first come: a rank is its engine's offset from the
		// base port (replay addressing depends on it), so a flood of made-up
		// ranks cannot take the places of ranks 0..maxRanks-1.
		if dp >= uint32(s.maxRanks) {
			s.reject(malformed(ReasonRanks, nil, "data_parallel_rank %d is beyond the source's ranks 0..%d", dp, s.maxRanks-1), msg.Seq, msg.Payload)
			return nil
		}
		r = &rank{member: ckf.Member{WorkerID: s.cfg.Worker, DPRank: dp}, state: RankLive}
		if s.cfg.Replay != "" {
			// The replay socket sits at the same offset as the PUB socket
			// the rank was heard on (bind mode: at the rank's offset).
			r.replayEP, _ = RankEndpoint(s.cfg.Replay, int(dp))
			if in.socket >= 0 {
				r.replayEP, _ = RankEndpoint(s.cfg.Replay, in.socket)
			}
		}
		s.addRank(r)
	}
	r.lastHeard = time.Now()
	s.update(func(st *source.Status) { st.LastEvent = r.lastHeard })
	defer s.publishRank(r)
	err = s.handleRank(ctx, sink, r, in, msg, b)
	if isEpochRefusal(err) {
		s.failRank(r, err)
		return nil
	}
	return err
}

// handleRank processes one message of rank r.
func (s *Source) handleRank(ctx context.Context, sink source.Sink, r *rank, in inbound, msg Message, b Batch) error {
	dp := r.member.DPRank

	restarted := false
	if b.PublisherID != nil && r.publisher != nil && string(b.PublisherID) != string(r.publisher) {
		restarted = true
	} else if r.synced && (r.ended || msg.Seq < r.next) {
		if r.isDuplicate(msg.Seq, msg.Payload) {
			s.update(func(st *source.Status) { st.Duplicates++ })
			return nil
		}
		restarted = true
	}
	if b.PublisherID != nil {
		r.publisher = append(r.publisher[:0], b.PublisherID...)
	}
	if restarted {
		if err := s.restart(ctx, sink, r, msg.Seq); err != nil {
			return err
		}
	}
	switch {
	case r.synced && msg.Seq == r.next && in.first && s.cfg.Replay != "" && r.next > 0:
		// Reconnected exactly where we left off: prove it is the same
		// publisher lifetime before applying.
		return s.recover(ctx, sink, r, r.next, msg, b, reasonReconnect)
	case r.synced && msg.Seq == r.next:
		return s.apply(ctx, sink, r, msg, b)
	case r.synced: // msg.Seq > r.next
		s.update(func(st *source.Status) { st.Gaps++ })
		s.logs.log(s.log, slog.LevelWarn, "zmq source: sequence gap", "rank", dp, "expected", r.next, "got", msg.Seq)
		return s.recover(ctx, sink, r, r.next, msg, b, reasonGap)
	case msg.Seq == 0: // first contact with a fresh engine
		if err := s.begin(ctx, sink, r, false, ""); err != nil {
			return err
		}
		return s.apply(ctx, sink, r, msg, b)
	default: // first contact mid-stream, or speaking again after a reset
		return s.recover(ctx, sink, r, 0, msg, b, reasonJoined)
	}
}

// begin starts r over: a new epoch with the rank reset, unless the current
// epoch has admitted nothing yet (then the pool holds nothing of it and the
// epoch is reused). degraded resets are always sent, so the pool counts them.
//
// The pool owns a member's epochs: a new epoch is one above both the
// source's and the pool's record (docs/ingest.md, "Source epochs"). So a
// rank first heard after a restart with --data-dir, or whose epoch an HTTP
// bridge raised, starts above the recorded epoch with a reset (the pool may
// hold blocks of an earlier lifetime). A reset still refused as stale (a
// writer raised the epoch meanwhile) is retried above the new record; an
// exhausted epoch space returns errEpochsExhausted.
func (s *Source) begin(ctx context.Context, sink source.Sink, r *rank, degraded bool, reason string) error {
	recorded, known := source.RecordedEpoch(sink, r.member)
	needReset := (r.epoch > 0 && !r.fresh) || (known && (r.epoch == 0 || recorded > r.epoch))
	r.fresh = true
	r.synced, r.next, r.ended = true, 0, false
	r.recent = [recentBatches]struct {
		seq    int64
		digest uint64
	}{}
	r.state, r.reason, r.known = RankLive, "", nil
	s.cv.ForgetRank(r.member.DPRank) // the rank's blocks are gone: so are their namespaces
	if degraded {
		r.state, r.reason, r.known = RankDegraded, reason, map[uint64]struct{}{}
	}
	if !needReset && r.epoch == 0 {
		r.epoch = 1
	}
	if !needReset && !degraded {
		return nil
	}
	for try := 0; ; try++ {
		base := max(r.epoch, recorded)
		if needReset || base > r.epoch {
			if base == math.MaxUint64 {
				return fmt.Errorf("zmq source: reset rank %d: %w", r.member.DPRank, errEpochsExhausted)
			}
			r.epoch = base + 1
		}
		err := sink.ResetRank(ctx, r.epoch, r.member, degraded)
		if err == nil {
			r.failing = false
			break
		}
		if !errors.Is(err, source.ErrStaleEpoch) || try == 2 {
			return fmt.Errorf("zmq source: reset rank %d: %w", r.member.DPRank, err)
		}
		recorded, _ = source.RecordedEpoch(sink, r.member)
		needReset = true
	}
	s.update(func(st *source.Status) { st.Resets++ })
	return nil
}

// errEpochsExhausted: the member's recorded epoch is 2^64−1, so no new
// epoch can be above it.
var errEpochsExhausted = errors.New("the member's source epoch is exhausted (2^64-1)")

// isEpochRefusal tells a refusal of the rank's epoch, on which the source
// reports "failing" and keeps going, from a sink that stopped.
func isEpochRefusal(err error) bool {
	return errors.Is(err, source.ErrStaleEpoch) || errors.Is(err, errEpochsExhausted)
}

// failRank marks r as unable to take an epoch: the next message tries again.
func (s *Source) failRank(r *rank, err error) {
	r.synced, r.state, r.reason, r.failing = false, RankReset, err.Error(), true
	s.logs.log(s.log, slog.LevelWarn, "zmq source: rank's epoch refused; retrying on its next message", "rank", r.member.DPRank, "err", err)
	s.update(func(st *source.Status) { st.LastError = err.Error() })
}

// restart handles a publisher that started over: a new epoch, the rank
// reset, and the stream taken up again as a first contact.
func (s *Source) restart(ctx context.Context, sink source.Sink, r *rank, seq int64) error {
	s.update(func(st *source.Status) { st.Restarts++ })
	s.logs.log(s.log, slog.LevelWarn, "zmq source: engine restart; new source epoch", "rank", r.member.DPRank, "seq", seq, "epoch", r.epoch+1)
	if err := s.begin(ctx, sink, r, false, ""); err != nil {
		return err
	}
	r.synced = false // take the new stream up from its start
	return nil
}

// recover fills [from, msg.Seq) from the engine's replay socket and applies
// it, then msg; what it cannot fill resets the rank (degraded).
func (s *Source) recover(ctx context.Context, sink source.Sink, r *rank, from int64, msg Message, b Batch, why string) error {
	replayEP := r.replayEP
	if replayEP == "" {
		return s.degrade(ctx, sink, r, msg, b, why+"; "+reasonNoReplay)
	}
	s.update(func(st *source.Status) { st.Replays++; st.State = "recovering" })
	// Ask for one batch we already hold (when we hold one): it proves the
	// buffer belongs to the same publisher lifetime.
	start := from
	check := r.synced && from > 0 && r.recent[uint64(from-1)%recentBatches].seq == from-1
	if check {
		start = from - 1
	}
	replies, err := Replay(s.guarded(ctx, zmq4.Dealer), replayEP, start, msg.Seq,
		ReplayLimits{Timeout: s.cfg.ReplayTimeout, MaxBatches: s.cfg.MaxReplayBatches, MaxBytes: s.cfg.MaxReplayBytes})
	if err != nil {
		s.logs.log(s.log, slog.LevelWarn, "zmq source: replay failed", "rank", r.member.DPRank, "endpoint", replayEP, "from", start, "err", err)
		if from == msg.Seq && r.synced {
			return s.apply(ctx, sink, r, msg, b) // nothing is missing
		}
		if errors.Is(err, ErrReplayOverrun) {
			return s.degrade(ctx, sink, r, msg, b, why+"; "+reasonOverrun)
		}
		return s.degrade(ctx, sink, r, msg, b, why+"; "+reasonReplayErr)
	}
	if check {
		if len(replies) == 0 || replies[0].Seq != start {
			if from == msg.Seq { // nothing is missing; continuity is merely unproven
				s.logs.log(s.log, slog.LevelInfo, "zmq source: could not verify continuity after reconnect", "rank", r.member.DPRank)
				return s.apply(ctx, sink, r, msg, b)
			}
			return s.degrade(ctx, sink, r, msg, b, why+"; "+reasonOverrun)
		}
		if !r.isDuplicate(start, replies[0].Payload) {
			// Same sequence numbers, different batches: the engine restarted
			// while we were not listening.
			if err := s.restart(ctx, sink, r, msg.Seq); err != nil {
				return err
			}
			return s.recover(ctx, sink, r, 0, msg, b, reasonRestart)
		}
		replies = replies[1:]
	}
	if len(replies) == 0 || replies[0].Seq != from {
		return s.degrade(ctx, sink, r, msg, b, why+"; "+reasonOverrun)
	}
	// Decode the whole cover before applying any of it.
	type decoded struct {
		msg Message
		b   Batch
	}
	cover := make([]decoded, 0, len(replies))
	for i, rep := range replies {
		if rep.Seq != from+int64(i) || rep.Seq >= msg.Seq {
			break
		}
		rb, err := s.dec.DecodeBatch(rep.Payload)
		if err != nil {
			s.reject(err, rep.Seq, rep.Payload)
			return s.degrade(ctx, sink, r, msg, b, why+"; "+reasonReplayErr)
		}
		cover = append(cover, decoded{rep, rb})
	}
	if from+int64(len(cover)) != msg.Seq {
		return s.degrade(ctx, sink, r, msg, b, why+"; "+reasonOverrun)
	}
	if !r.synced {
		if err := s.begin(ctx, sink, r, false, ""); err != nil {
			return err
		}
	}
	for _, c := range cover {
		if err := s.apply(ctx, sink, r, c.msg, c.b); err != nil {
			return err
		}
	}
	s.logs.log(s.log, slog.LevelInfo, "zmq source: gap filled from replay", "rank", r.member.DPRank, "from", from, "batches", len(cover), "why", why)
	return s.apply(ctx, sink, r, msg, b)
}

// degrade resets the rank because history is lost, then applies msg: the
// rank advertises only what it has heard since.
func (s *Source) degrade(ctx context.Context, sink source.Sink, r *rank, msg Message, b Batch, why string) error {
	s.logs.log(s.log, slog.LevelWarn, "zmq source: rank reset (degraded)", "rank", r.member.DPRank, "reason", why, "seq", msg.Seq, "epoch", r.epoch+1)
	if err := s.begin(ctx, sink, r, true, why); err != nil {
		return err
	}
	s.update(func(st *source.Status) { st.Degraded++ })
	r.next = msg.Seq
	return s.apply(ctx, sink, r, msg, b)
}

// apply admits one batch of r's stream (msg.Seq == r.next). When another
// writer (an HTTP bridge's reset) has raised the member's epoch, the pool
// dropped what the rank had admitted: the rank is reset above that epoch,
// degraded, before the batch is admitted.
func (s *Source) apply(ctx context.Context, sink source.Sink, r *rank, msg Message, b Batch) error {
	if cur, ok := source.RecordedEpoch(sink, r.member); ok && cur > r.epoch {
		s.logs.log(s.log, slog.LevelWarn, "zmq source: another writer raised the rank's epoch; rank reset (degraded)", "rank", r.member.DPRank, "epoch", r.epoch, "recorded", cur)
		if err := s.begin(ctx, sink, r, true, reasonEpochRaised); err != nil {
			return err
		}
		s.update(func(st *source.Status) { st.Degraded++ })
		r.next = msg.Seq
	}
	var dropped uint64
	drops := batchDrops{events: len(b.Events)}
	// The batch's events go to the pool as one command (one mailbox send).
	evs := make([]ckf.RouterEvent, 0, len(b.Events))
	blocks := 0
	for i := range b.Events {
		if b.Events[i].Type == BlockStored {
			blocks += len(b.Events[i].BlockHashes)
		}
	}
	s.cv.beginBatch(blocks)
	for i := range b.Events {
		ev := &b.Events[i]
		if r.known != nil && ev.Type == BlockStored && ev.HasParent {
			if _, ok := r.known[ev.ParentHash]; !ok {
				dropped += uint64(len(ev.BlockHashes))
				drops.add(DropParentLost, len(ev.BlockHashes), true)
				continue
			}
		}
		s.eventID++
		out, ok, n, why := s.cv.Convert(ev, r.member.DPRank, s.eventID)
		dropped += uint64(n)
		drops.add(why, n, !ok)
		if !ok {
			if ev.Type == Unknown {
				dropped++
			}
			continue
		}
		if r.known != nil && out.StorageTier == ckf.TierDevice {
			switch out.Kind {
			case ckf.EventStored:
				for _, bl := range out.Blocks {
					r.known[bl.BlockHash] = struct{}{}
				}
			case ckf.EventRemoved:
				for _, h := range out.BlockHashes {
					delete(r.known, h)
				}
			case ckf.EventCleared:
				// Everything before is gone: the rank is exact again.
				r.known, r.state, r.reason = nil, RankLive, ""
			}
		} else if out.Kind == ckf.EventCleared && r.state != RankLive {
			r.state, r.reason = RankLive, ""
		}
		evs = append(evs, out)
	}
	var err error
	if cs, ok := sink.(source.CursorSink); ok {
		if r.cursor == "" {
			r.cursor = s.cursorSource(r.member.DPRank)
		}
		err = cs.AdmitEventsAt(ctx, r.epoch, evs, producer.Cursor{Source: r.cursor, Seq: uint64(msg.Seq)})
	} else {
		err = sink.AdmitEvents(ctx, r.epoch, evs)
	}
	if err != nil {
		return fmt.Errorf("zmq source: admit: %w", err)
	}
	if len(evs) > 0 {
		r.fresh = false
	}
	events := uint64(len(evs))
	r.remember(msg.Seq, msg.Payload)
	r.next, r.ended = msg.Seq+1, msg.Seq == math.MaxInt64
	if r.ended {
		r.next = msg.Seq // stands for 2^63 (see rank.ended): never wrapped to -2^63
	}
	s.update(func(st *source.Status) {
		st.Batches++
		st.Events += catalog.U64(events)
		st.Dropped += catalog.U64(dropped)
	})
	s.noteBatch(&drops, msg.Payload)
	return nil
}

// checkSilence resets every rank heard nothing from for SourceTimeout.
func (s *Source) checkSilence(ctx context.Context, sink source.Sink, now time.Time) error {
	for _, r := range s.ranks {
		if !r.synced || now.Sub(r.lastHeard) < s.cfg.SourceTimeout {
			continue
		}
		s.logs.log(s.log, slog.LevelWarn, "zmq source: rank silent; reset", "rank", r.member.DPRank, "silent_for", now.Sub(r.lastHeard).Round(time.Millisecond))
		if err := s.begin(ctx, sink, r, false, ""); err != nil {
			if isEpochRefusal(err) {
				s.failRank(r, err)
				s.publishRank(r)
				continue
			}
			return err
		}
		r.synced, r.state, r.reason = false, RankReset, reasonSilent
		s.update(func(st *source.Status) { st.Silences++ })
		s.publishRank(r)
	}
	return nil
}
