package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/producer"
)

// Role is what a replica does for its pool.
type Role uint8

// Roles.
const (
	RoleStandby Role = iota
	RoleLeader
)

func (r Role) String() string {
	if r == RoleLeader {
		return "leader"
	}
	return "standby"
}

// Pool is one incarnation of the replica's pool: its actor and the
// recorder the actor journals into. A leader that loses its lease discards
// its pool (it holds speculative state no record covers) and starts a new
// one from the stream.
type Pool struct {
	Handle   producer.Handle
	Recorder *Recorder
	// Close stops the actor (it may be nil).
	Close func()
}

// NodeConfig configures a Node.
type NodeConfig struct {
	Pool    string // the pool's name: its subject token and lease key
	Node    string // this replica's id (distinct per replica, also on one host)
	Address string // where this replica serves (standbys point clients here)

	JS            jetstream.JetStream
	Stream        jetstream.Stream // the records stream (EnsureStream)
	SubjectPrefix string           // "" means DefaultSubjectPrefix
	Leases        *Leases
	MaxMessage    int // 0 means DefaultMaxMessage

	// NewPool starts a fresh, empty pool whose actor journals into the
	// returned Recorder (not recording).
	NewPool func() (Pool, error)

	// Checkpoints, if set, is where the pool's checkpoints are: a
	// rebuilding replica loads the newest that loads (falling back to the
	// older) and follows the records after it, and a standby stores one
	// every CheckpointRecords records or CheckpointBytes bytes of records,
	// then purges the subject below the older kept checkpoint. Without it
	// a rebuild replays the whole subject and the stream only grows.
	Checkpoints *Checkpoints
	// PoolFromImage starts a pool from a checkpoint's image
	// ([producer.StartImage]) whose actor journals into the returned
	// Recorder (not recording); the node sets the recorder's position.
	// Required with Checkpoints.
	PoolFromImage func(img *producer.Image) (Pool, error)
	// CheckpointRecords and CheckpointBytes (config
	// ha.checkpoint_records, ha.checkpoint_bytes): a standby takes a
	// checkpoint once it applied this many records, or this many bytes of
	// records, since its last one. 0 means DefaultCheckpointRecords,
	// DefaultCheckpointBytes.
	CheckpointRecords int
	CheckpointBytes   int64
	// OnChange, if set, is called on every role change with the pool that
	// serves from now on and the reason; it runs on the node's goroutine.
	OnChange func(st Status, p Pool, reason string)
	Logger   *slog.Logger

	// renewPaused (tests): while it returns true the leader skips its
	// renewals but goes on admitting and appending, as a leader whose
	// renewals stall (a partition from the KV leader, a long pause) would.
	renewPaused func() bool
	// clockBroken (tests): while it returns true the leader ignores its
	// lease deadline — a leader whose clock lies — so only the records
	// chain can fence it.
	clockBroken func() bool
	// now (tests): the clock Run reads to tell how long a standby followed
	// before it failed (nil: time.Now), so a test can let a standby have
	// followed for healthyStandby without waiting for it.
	now func() time.Time
}

// Status is a replica's view of its pool's group.
type Status struct {
	Role    Role
	Leader  string // node id of the term's leader (its term record)
	Address string // the leader's address
	Term    uint64
	// Applied is the stream sequence of the last record this replica
	// applied (a standby) or appended (the leader).
	Applied uint64
	// Tail is the stream sequence of the subject's last record when last
	// read (a standby's lag is Tail − Applied records on the subject).
	Tail uint64
	// Rebuilds counts the pools discarded and rebuilt from the stream (a
	// leader stepping down, a broken chain).
	Rebuilds uint64
	// Loaded is the stream sequence of the checkpoint the pool started
	// from (0: it replayed the subject from its start).
	Loaded uint64
	// Checkpoint is the stream sequence of the last checkpoint this
	// replica stored (0: none yet).
	Checkpoint uint64
	// PurgedBelow is the stream sequence below which this replica last
	// purged the pool's subject (0: it purged nothing).
	PurgedBelow uint64
	// Halted, when not empty, is why the chain halts at the record after
	// Applied (errChainHalted): the replica keeps its state and retries;
	// Halts counts the halts.
	Halted string
	Halts  uint64
	// LastError is why the replica last stopped leading or rebuilt its
	// pool ("" until it did): a leader whose appends a full JetStream
	// refuses says so here, not only in its log.
	LastError string
}

// Defaults of the checkpoint cadence: a standby checkpoints after this many
// records or bytes of records, whichever comes first. A checkpoint writes
// the whole image (up to 128 MiB of words for the largest table), so the
// byte bound keeps checkpoint traffic at most about the record traffic for
// tables up to 64 MiB, and a rebuild replays at most ~64 MiB of records.
const (
	DefaultCheckpointRecords = 100_000
	DefaultCheckpointBytes   = 64 << 20
)

// origin is where a pool starts following the chain: after a checkpoint's
// record, or at the start.
type origin struct {
	seq, term uint64
	leader    TermRecord
	cursors   []producer.Cursor
}

// MaxCursorSources bounds the sources whose cursors a pool's replicas keep:
// a cursor of a further source is not kept (every replica drops the same
// ones, in the same order), and its source resumes as if it had none.
const MaxCursorSources = 4096

// Node runs one pool's replica: a standby that applies the records stream
// and takes the lease when it is free, and a leader that appends what its
// actor admits and renews the lease, until either is lost.
type Node struct {
	cfg     NodeConfig
	subject string
	log     *slog.Logger

	mu     sync.Mutex
	status Status
	pool   Pool
	// acked is the journal position covered by the last stored append of
	// the current term (0 while not leading); ackedCh is closed and
	// replaced whenever it moves or the node stops leading.
	acked   uint64
	leading bool
	ackedCh chan struct{}

	resign     chan struct{} // closed by Resign
	resignOnce sync.Once

	// cursors: how far each source's stream is in the records applied (a
	// standby) or appended (the leader); guarded by mu.
	cursors map[string]uint64

	// The standby's checkpoint cadence: records and bytes applied since
	// the last checkpoint (follow's goroutine only), one store at a time.
	sinceRecords int
	sinceBytes   int64
	storing      atomic.Bool
	stores       sync.WaitGroup

	// deadline is the held lease's deadline (boottime ns) while leading, 0
	// otherwise: Leads reads it from other goroutines.
	deadline atomic.Int64

	// highest is the highest stream sequence of the subject this node ever
	// applied or appended, across rebuilds (guarded by mu): a subject whose
	// tail falls below it lost records — purged, or the stream made anew —
	// and this replica must not lead what is left.
	highest uint64

	// token is the holder token of the last lease this node acquired.
	token atomic.Pointer[string]
}

// Acquired reports whether token is the holder token of the last lease
// this node acquired — whether it leads with it or failed to take over
// with it. A lease under this node's id with another token was taken by
// another relay that uses the same node id.
func (n *Node) Acquired(token string) bool {
	t := n.token.Load()
	return t != nil && *t == token
}

// Leads reports whether the node leads now by its own clock: it holds the
// lease and the lease's deadline (CLOCK_BOOTTIME) has not passed. Outputs
// produced beside the node (a NATS fan-out's heartbeats) check it before
// each publish: a leader resumed after a suspension past its deadline
// stops before its loop notices.
func (n *Node) Leads() bool {
	d := n.deadline.Load()
	return d != 0 && boottime() < time.Duration(d)
}

// errResigned ends Run after Resign.
var errResigned = errors.New("replica: resigned")

// Resign ends the node's Run for a planned stop (a rolling upgrade): a
// leader stops leading — what it admitted and did not see acknowledged is
// not the group's — and deletes its lease key, so a standby, woken by the
// delete marker, takes over at once instead of after the TTL. A standby
// just stops. Run then returns nil.
func (n *Node) Resign() {
	n.resignOnce.Do(func() { close(n.resign) })
}

// ErrNotLeader: the node does not lead (any more); what it admitted and did
// not see acknowledged is not the group's.
var ErrNotLeader = errors.New("replica: not the leader")

// WaitAcked waits until the journal position pos (a [Recorder.Position]
// read after admitting) is covered by a stored append: only then may the
// leader answer, publish or acknowledge what it admitted up to there. It
// fails with ErrNotLeader when the node stops leading first.
func (n *Node) WaitAcked(ctx context.Context, pos uint64) error {
	for {
		n.mu.Lock()
		acked, leading, ch := n.acked, n.leading, n.ackedCh
		n.mu.Unlock()
		switch {
		case !leading:
			return ErrNotLeader
		case acked >= pos:
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// setAcked records a stored append (or, with leading false, the end of
// leadership) and wakes the waiters.
func (n *Node) setAcked(pos uint64, leading bool) {
	n.mu.Lock()
	n.acked, n.leading = pos, leading
	if n.ackedCh != nil {
		close(n.ackedCh)
	}
	n.ackedCh = make(chan struct{})
	n.mu.Unlock()
}

// NewNode returns a node; Run starts it.
func NewNode(cfg NodeConfig) (*Node, error) {
	subject, err := Subject(cfg.SubjectPrefix, cfg.Pool)
	if err != nil {
		return nil, err
	}
	if cfg.JS == nil || cfg.Stream == nil || cfg.Leases == nil || cfg.NewPool == nil || cfg.Node == "" {
		return nil, errors.New("replica: a node needs JS, Stream, Leases, NewPool and a node id")
	}
	if cfg.Checkpoints != nil && cfg.PoolFromImage == nil {
		return nil, errors.New("replica: a node with checkpoints needs PoolFromImage")
	}
	if cfg.CheckpointRecords <= 0 {
		cfg.CheckpointRecords = DefaultCheckpointRecords
	}
	if cfg.CheckpointBytes <= 0 {
		cfg.CheckpointBytes = DefaultCheckpointBytes
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.now == nil {
		cfg.now = time.Now
	}
	return &Node{cfg: cfg, subject: subject, log: log.With("pool", cfg.Pool, "node", cfg.Node), resign: make(chan struct{})}, nil
}

func (n *Node) now() time.Time { return n.cfg.now() }

// Status returns the node's current status.
func (n *Node) Status() Status {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.status
}

// Pool returns the pool serving now.
func (n *Node) Pool() Pool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.pool
}

func (n *Node) update(f func(*Status)) {
	n.mu.Lock()
	f(&n.status)
	n.mu.Unlock()
}

func (n *Node) change(role Role, reason string) {
	n.mu.Lock()
	n.status.Role = role
	st, p := n.status, n.pool
	n.mu.Unlock()
	n.log.Info("replica: role change", "role", role.String(), "term", st.Term, "leader", st.Leader, "applied", st.Applied, "reason", reason)
	if n.cfg.OnChange != nil {
		n.cfg.OnChange(st, p, reason)
	}
}

// Rebuilds after a standby's failure back off exponentially between these.
const (
	minRebuildBackoff = 100 * time.Millisecond
	maxRebuildBackoff = 30 * time.Second
)

// healthyStandby: a standby that ran this long before failing rebuilds
// after the shortest back-off, whatever failed before.
const healthyStandby = 10 * time.Second

// maxFollowBackoff bounds the wait between attempts to start following
// again: the pool is intact, and a standby that waits long after NATS
// recovered is a standby that cannot take over.
const maxFollowBackoff = 2 * time.Second

// errChainHalted: the next record on the subject cannot be applied — it
// does not decode, or its term is not the chain's — and nothing of it was
// applied. Rebuilding would replay the subject to the same record and meet
// it again with an empty pool (a foreign writer's garbage on the records
// subject emptied every replica that way), so the standby keeps its state
// up to the record before, says so loudly and tries again after a back-off.
var errChainHalted = errors.New("replica: the records chain halts at a record this replica cannot apply")

// ErrForeignTerm: the records chain is at a term the lease never issued to
// this replica's candidacy — a term record beyond the lease's revision,
// written by something that is not a replica of this group. A replica does
// not lead below the chain's term (a standby could never apply its records).
var ErrForeignTerm = errors.New("replica: the records chain is at a term beyond the lease's")

// errNotFollowing: a standby could not start following its records (the
// consumer or the lease watch was not created). Nothing was applied by the
// attempt, so the pool is kept and the standby tries again.
var errNotFollowing = errors.New("replica: not following the records")

// Run runs the replica until ctx ends. It does not release a held lease
// then (the lease expires after its TTL, as if the process had died).
func (n *Node) Run(ctx context.Context) error {
	defer n.stores.Wait()
	reason := "started"
	backoff := time.Duration(0)
	for {
		if backoff > 0 {
			// A chain that breaks again at once (a corrupt record, a
			// stream purged above every checkpoint) must not become a hot
			// loop of rebuilds and log lines.
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		p, from, err := n.startPool(ctx)
		if errors.Is(err, ErrStateLost) {
			n.log.Error("replica: cannot rebuild the pool", "err", err)
			return err
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			backoff = min(max(2*backoff, minRebuildBackoff), maxRebuildBackoff)
			n.log.Warn("replica: starting the pool", "err", err, "retry after", backoff)
			continue
		}
		n.sinceRecords, n.sinceBytes = 0, 0
		n.mu.Lock()
		n.pool = p
		n.cursors = make(map[string]uint64, len(from.cursors))
		for _, c := range from.cursors {
			n.cursors[c.Source] = c.Seq
		}
		n.status = Status{Role: RoleStandby, Rebuilds: n.status.Rebuilds, Checkpoint: n.status.Checkpoint, PurgedBelow: n.status.PurgedBelow, Halts: n.status.Halts, LastError: n.status.LastError,
			Loaded: from.seq, Applied: from.seq, Tail: from.seq, Term: from.term, Leader: from.leader.Node, Address: from.leader.Address}
		n.mu.Unlock()
		n.change(RoleStandby, reason)
		started := n.now()
		lease, app, err := n.standby(ctx, p, from)
		for retry, halted := minRebuildBackoff, minRebuildBackoff; (errors.Is(err, errNotFollowing) || errors.Is(err, errChainHalted)) && ctx.Err() == nil; {
			// NATS did not let the standby start following (a consumer or
			// a watch that could not be created while a node was dead or
			// a stream re-elected its leader), or the next record cannot
			// be applied. Its pool is intact up to the last record
			// applied: follow again from there instead of replaying the
			// subject.
			wait := retry
			if errors.Is(err, errChainHalted) {
				wait, halted = halted, min(2*halted, maxRebuildBackoff)
				n.update(func(s *Status) { s.Halted, s.Halts = err.Error(), s.Halts+1 })
				n.log.Error("replica: the records chain halts; keeping the state applied so far", "err", err, "applied", n.Status().Applied, "retry after", wait)
			} else {
				retry = min(2*retry, maxFollowBackoff)
				n.log.Warn("replica: following the records again", "err", err, "after", wait)
			}
			select {
			case <-time.After(wait):
			case <-ctx.Done():
			}
			st := n.Status()
			from = origin{seq: st.Applied, term: st.Term, leader: TermRecord{Node: st.Leader, Address: st.Address}}
			lease, app, err = n.standby(ctx, p, from)
		}
		led := err == nil
		if led {
			err = n.lead(ctx, p, lease, app)
			// The pool is discarded: say so now, before its outputs stop
			// (Close waits for the sources and the fan-out) and the
			// rebuild reads the stream and the checkpoints. No leader is
			// known until a term record names the next one. The change
			// is logged and announced below.
			n.update(func(s *Status) { s.Role, s.Leader, s.Address = RoleStandby, "", "" })
		}
		p.Recorder.SetRecording(false)
		if p.Close != nil {
			p.Close()
		}
		if led && ctx.Err() == nil && !errors.Is(err, errResigned) {
			// Announced now, not once the rebuild's NATS reads succeed: a
			// leader cut off from NATS kept reporting itself the leader
			// for as long as the partition lasted.
			n.change(RoleStandby, "stopped leading: "+err.Error())
		}
		if errors.Is(err, ErrStateLost) {
			n.log.Error("replica: the pool's records were lost; not following or leading them", "err", err)
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, errResigned) {
			n.setAcked(0, false)
			n.change(RoleStandby, "resigned")
			return nil
		}
		reason = err.Error()
		n.update(func(s *Status) { s.Rebuilds++; s.LastError = reason })
		switch {
		case led:
			backoff = 0
		case n.now().Sub(started) >= healthyStandby:
			// A standby that followed for a while and then failed starts
			// its back-off anew: the doubling is for a chain that breaks
			// again at once, not for failures hours apart.
			backoff = minRebuildBackoff
		default:
			backoff = min(max(2*backoff, minRebuildBackoff), maxRebuildBackoff)
		}
		n.log.Warn("replica: rebuilding the pool from the stream", "err", err, "after", backoff)
	}
}

// standby applies records until it holds the lease, has applied every
// record on the subject and its term record is appended.
func (n *Node) standby(ctx context.Context, p Pool, from origin) (*Lease, *Appender, error) {
	f, err := Follow(ctx, n.cfg.JS, n.cfg.Stream.CachedInfo().Config.Name, n.subject, from.seq, from.term, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", errNotFollowing, err)
	}
	defer f.Stop()
	f.OnStall(func(tail, applied uint64) {
		n.log.Warn("replica: the records consumer is silent although the subject holds more; recreating it",
			"applied", applied, "tail", tail)
	})
	free, stopWatch, err := n.cfg.Leases.WatchFree(ctx, n.cfg.Pool)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", errNotFollowing, err)
	}
	defer stopWatch()
	// The watch is the fast path; a check every TTL is the fallback for a
	// watch that stalled (its consumer lived on a NATS node that died and
	// the client has not noticed yet).
	poll := time.NewTicker(n.cfg.Leases.cfg.TTL)
	defer poll.Stop()
	for {
		// Apply records until the lease is free.
		fctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- n.follow(fctx, ctx, f, p) }()
		select {
		case <-free:
			// The lease expired or was released: the last term's leader
			// no longer leads, so clients are not sent to it.
			n.update(func(s *Status) { s.Leader, s.Address = "", "" })
		case <-poll.C:
		case <-n.resign:
			cancel()
			<-done
			return nil, nil, errResigned
		case err := <-done:
			cancel()
			return nil, nil, err
		}
		cancel()
		if err := <-done; err != nil && fctx.Err() == nil {
			return nil, nil, err
		}
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		lease, err := n.cfg.Leases.Acquire(ctx, n.cfg.Pool, n.cfg.Node, n.cfg.Address)
		if err == nil {
			tok := lease.Token()
			n.token.Store(&tok)
		}
		var held *HeldError
		if errors.As(err, &held) {
			continue
		}
		if err != nil {
			n.log.Warn("replica: acquiring the lease", "err", err)
			continue
		}
		app, err := n.takeOver(ctx, f, p, lease)
		if err == nil {
			return lease, app, nil
		}
		if errors.Is(err, ErrForeignTerm) {
			// Not leading below the chain's term; the lease runs out
			// and the next candidate meets the same chain.
			n.log.Error("replica: not taking over: a term record on the subject did not come from this group's lease", "err", err)
			continue
		}
		n.log.Warn("replica: takeover failed", "term", lease.Term(), "err", err)
		if errors.Is(err, ErrRefused) || !lease.Valid() {
			continue
		}
		return nil, nil, err
	}
}

// follow applies records until waitCtx ends or the chain breaks. A record
// is applied whole, under applyCtx: cancelling the wait never leaves half
// a batch applied.
func (n *Node) follow(waitCtx, applyCtx context.Context, f *Follower, p Pool) error {
	for {
		rec, err := f.Next(waitCtx)
		if err != nil {
			return chainError(err)
		}
		if err := n.apply(applyCtx, rec, p); err != nil {
			return err
		}
		if n.cfg.Checkpoints == nil {
			continue
		}
		n.sinceRecords++
		n.sinceBytes += int64(rec.Bytes)
		if (n.sinceRecords >= n.cfg.CheckpointRecords || n.sinceBytes >= n.cfg.CheckpointBytes) && !n.storing.Load() {
			if err := n.checkpoint(applyCtx, p, rec); err != nil {
				return err
			}
		}
	}
}

// chainError classifies a Follower's error: a record that cannot be
// applied halts the chain (errChainHalted, the state is kept); a record
// that names a predecessor before the last one applied means the subject
// was purged or made anew under this replica (ErrStateLost); records
// missing ahead (a purge below a checkpoint while this replica was behind)
// need a rebuild from the checkpoint, as does anything else.
func chainError(err error) error {
	var gap *GapError
	var term *TermError
	switch {
	case errors.As(err, &gap) && gap.Prev < gap.Applied:
		return fmt.Errorf("%w: %w", ErrStateLost, err)
	case errors.Is(err, ErrCorrupt), errors.As(err, &term):
		return fmt.Errorf("%w: %w", errChainHalted, err)
	}
	return err
}

func (n *Node) apply(ctx context.Context, rec Record, p Pool) error {
	if rec.Batch != nil {
		if err := Apply(ctx, p.Handle, rec.Batch.Commands); err != nil {
			return err
		}
	}
	if rec.Batch != nil {
		n.noteCursors(rec.Batch.Commands)
	}
	n.update(func(s *Status) {
		s.Applied, s.Term, s.Halted = rec.Seq, rec.Term, ""
		s.Tail = max(s.Tail, rec.Seq)
		n.highest = max(n.highest, rec.Seq)
		if rec.Leader != nil {
			s.Leader, s.Address = rec.Leader.Node, rec.Leader.Address
		}
	})
	return nil
}

// takeOver catches up with the subject's tail and appends the term
// record expecting the last record applied: the node leads only if that
// append is stored.
func (n *Node) takeOver(ctx context.Context, f *Follower, p Pool, lease *Lease) (*Appender, error) {
	lctx, cancel := context.WithTimeout(ctx, lease.Remaining())
	defer cancel()
	for {
		tail, err := Tail(lctx, n.cfg.Stream, n.subject)
		if err != nil {
			return nil, err
		}
		n.mu.Lock()
		highest := n.highest
		n.mu.Unlock()
		if tail < highest {
			// The direct get may have been answered by a NATS replica
			// behind the records this one applied through its consumer:
			// only the stream's leader says the subject lost them.
			if tail, err = n.leaderLookups().tail(lctx); err != nil {
				return nil, fmt.Errorf("replica: the subject's tail read below the records applied, and its leader cannot confirm it: %w", err)
			}
		}
		n.update(func(s *Status) { s.Tail = tail })
		if tail < highest {
			return nil, fmt.Errorf("%w: the subject %s ends at stream sequence %d, but this replica applied up to %d", ErrStateLost, n.subject, tail, highest)
		}
		for f.Applied() < tail {
			rec, err := f.Next(lctx)
			if err != nil {
				return nil, chainError(err)
			}
			if err := n.apply(lctx, rec, p); err != nil {
				return nil, err
			}
		}
		if lease.Term() <= f.Term() {
			return nil, fmt.Errorf("%w: chain term %d, lease term %d", ErrForeignTerm, f.Term(), lease.Term())
		}
		app := NewAppender(n.cfg.JS, n.cfg.Stream, n.subject, lease.Term(), f.Applied(), n.cfg.MaxMessage)
		err = app.Term(lctx, TermRecord{Node: n.cfg.Node, Address: n.cfg.Address})
		if errors.Is(err, ErrRefused) {
			continue // a deposed leader's last append landed: apply it too
		}
		if err != nil {
			return nil, err
		}
		// Everything before the term record is applied: wait for the
		// actor, so the journal position counts it before recording starts.
		if _, err := p.Handle.ExportState(lctx); err != nil {
			return nil, err
		}
		return app, nil
	}
}

// lead appends what the actor journals and renews the lease until either
// fails; it returns why it stopped leading.
func (n *Node) lead(ctx context.Context, p Pool, lease *Lease, app *Appender) error {
	p.Recorder.SetRecording(true)
	n.deadline.Store(int64(lease.deadline))
	defer n.deadline.Store(0)
	// Everything journalled before the term record is stored.
	n.setAcked(p.Recorder.Position(), true)
	defer n.setAcked(0, false)
	n.update(func(s *Status) {
		s.Term, s.Leader, s.Address, s.Applied, s.Tail = lease.Term(), n.cfg.Node, n.cfg.Address, app.Last(), app.Last()
		n.highest = max(n.highest, app.Last())
	})
	n.change(RoleLeader, "took the lease and appended the term record")
	valid := func() bool { return lease.Valid() || (n.cfg.clockBroken != nil && n.cfg.clockBroken()) }
	remaining := func() time.Duration {
		if n.cfg.clockBroken != nil && n.cfg.clockBroken() {
			return 5 * time.Second
		}
		return lease.Remaining()
	}
	ttl := n.cfg.Leases.cfg.TTL
	// The lease key deleted or expired under this leader (a foreign
	// delete, a bucket whose TTL changed, a renewal that came too late):
	// learnt from the watch at once, not at the next renewal a third of
	// the TTL later, meanwhile another replica may lead. Without the
	// watch (it could not be created) the renewals still find out.
	lost, stopWatch, werr := n.cfg.Leases.WatchFree(ctx, n.cfg.Pool)
	if werr != nil {
		n.log.Warn("replica: watching the held lease; relying on renewals", "err", werr)
		lost, stopWatch = nil, func() {}
	}
	defer stopWatch()
	renew := time.NewTicker(ttl / 3)
	defer renew.Stop()
	expiry := time.NewTimer(lease.Remaining())
	defer expiry.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-n.resign:
			p.Recorder.SetRecording(false)
			n.deadline.Store(0)
			n.setAcked(0, false)
			rctx, cancel := context.WithTimeout(ctx, max(lease.Remaining(), time.Millisecond))
			err := lease.Release(rctx)
			cancel()
			if err != nil {
				n.log.Warn("replica: releasing the lease (it expires after its TTL)", "err", err)
			}
			return errResigned
		case <-lost:
			if n.cfg.clockBroken == nil || !n.cfg.clockBroken() {
				return fmt.Errorf("%w: the lease key was deleted or expired", ErrLost)
			}
		case <-expiry.C:
			if !valid() {
				return errors.New("the lease deadline passed without a stored renewal")
			}
			expiry.Reset(max(remaining(), time.Millisecond))
		case <-renew.C:
			if n.cfg.renewPaused != nil && n.cfg.renewPaused() {
				continue
			}
			rctx, cancel := context.WithTimeout(ctx, max(lease.Remaining(), time.Millisecond))
			err := lease.Renew(rctx)
			cancel()
			if errors.Is(err, ErrLost) {
				return err
			}
			if err != nil {
				n.log.Warn("replica: renewing the lease", "err", err)
			}
			n.deadline.Store(int64(lease.deadline))
			expiry.Reset(max(remaining(), time.Millisecond))
		case <-p.Recorder.Ready():
			if !valid() {
				return errors.New("the lease deadline passed before an append")
			}
			pos, cmds := p.Recorder.Take()
			if len(cmds) == 0 {
				continue
			}
			actx, cancel := context.WithTimeout(ctx, remaining())
			err := app.Append(actx, pos, cmds)
			cancel()
			if err != nil {
				return fmt.Errorf("append refused or not stored in time: %w", err)
			}
			n.noteCursors(cmds)
			n.setAcked(pos+uint64(len(cmds)), true)
			n.update(func(s *Status) {
				s.Applied, s.Tail = app.Last(), app.Last()
				n.highest = max(n.highest, app.Last())
			})
		}
	}
}

// checkpointStoreTimeout bounds a standby's storing of one checkpoint (the
// object, the index, the deletes, the purge). It runs beside the follow
// loop, one at a time: a store that cannot finish delays only the next
// checkpoint.
const checkpointStoreTimeout = 2 * time.Minute

// checkpointSweepTimeout bounds the sweep after a checkpoint's store
// (Checkpoints.Sweep lists the bucket through a consumer, which waits for
// the store's stream leader): it is best effort, and the next checkpoint
// sweeps again.
const checkpointSweepTimeout = 10 * time.Second

// startPool starts the pool a replica rebuilds: from the newest checkpoint
// that loads — a damaged one is skipped, loudly, for the older — or, with
// none, empty, provided the subject still starts at its first record. A
// purged subject without a loadable checkpoint is ErrStateLost: starting
// empty would make this replica a leader of nothing. A checkpoint that
// cannot be listed or read in time (no NATS replica answers) is not
// damage: with the subject still whole the replica replays it, otherwise
// startPool fails and Run retries. Every lookup is a direct get bounded by
// CheckpointRequestTimeout, so nothing here waits for a stream's leader —
// except the verdict: direct gets may be answered by a replica behind (an
// index that still names checkpoints deleted since, a subject not yet
// purged or already purged further), so ErrStateLost is concluded only
// when the same lookups through the streams' leaders reach it too. When
// the leaders cannot answer, startPool fails without it and Run retries.
func (n *Node) startPool(ctx context.Context) (Pool, origin, error) {
	p, from, err := n.loadPool(ctx, n.directLookups())
	if !errors.Is(err, ErrStateLost) {
		return p, from, err
	}
	p, from, lerr := n.loadPool(ctx, n.leaderLookups())
	switch {
	case lerr == nil:
		n.log.Warn("replica: the replicas that answered first saw the pool's state lost; its streams' leaders do not", "err", err)
		return p, from, nil
	case errors.Is(lerr, ErrStateLost):
		return Pool{}, origin{}, lerr
	}
	return Pool{}, origin{}, fmt.Errorf("replica: the pool's records and checkpoints look lost, and their streams' leaders cannot confirm it now: %w (by direct gets: %v)", lerr, err)
}

// loadPool is startPool with the lookups of l.
func (n *Node) loadPool(ctx context.Context, l lookups) (Pool, origin, error) {
	tried := 0
	var unread error // why a checkpoint could not be listed or read, if not damage
	if cs := n.cfg.Checkpoints; cs != nil {
		seqs, err := l.list(ctx)
		if err != nil {
			unread = err
		}
		tail := uint64(0)
		if len(seqs) > 0 {
			tail, err = l.tail(ctx)
			if err != nil {
				return Pool{}, origin{}, err
			}
		}
		for i, seq := range seqs {
			tried++
			if seq > tail {
				// A checkpoint of a records stream that was deleted and
				// made anew: its records are not this chain's.
				n.log.Warn("replica: skipping a checkpoint beyond the subject's tail", "checkpoint", seq, "tail", tail)
				continue
			}
			ck, err := cs.Get(ctx, n.cfg.Pool, seq)
			if errors.Is(err, ErrDamagedCheckpoint) {
				n.log.Error("replica: checkpoint does not load, falling back to an older one", "checkpoint", seq, "err", err)
				continue
			}
			if err != nil {
				n.log.Warn("replica: checkpoint cannot be read now, trying an older one", "checkpoint", seq, "err", err)
				unread = err
				continue
			}
			p, err := n.cfg.PoolFromImage(&ck.Image)
			if errors.Is(err, ckf.ErrInvalidImage) {
				n.log.Error("replica: checkpoint image is inconsistent, falling back to an older one", "checkpoint", seq, "err", err)
				continue
			}
			if err != nil {
				return Pool{}, origin{}, fmt.Errorf("replica: pool from checkpoint %d: %w", seq, err)
			}
			p.Recorder.setPosition(ck.Image.JournalPosition)
			n.log.Info("replica: loaded a checkpoint", "checkpoint", seq, "term", ck.Term, "fell_back", i > 0)
			return p, origin{seq: ck.Seq, term: ck.Term, leader: ck.Leader, cursors: ck.Cursors}, nil
		}
	}
	prev, err := l.firstPrev(ctx)
	if err != nil {
		return Pool{}, origin{}, err
	}
	if prev != 0 && unread != nil {
		return Pool{}, origin{}, fmt.Errorf("replica: the subject %s starts after stream sequence %d and its checkpoints cannot be read now: %w", n.subject, prev, unread)
	}
	if prev != 0 {
		return Pool{}, origin{}, fmt.Errorf("%w: the subject %s starts after stream sequence %d, and %d checkpoints were tried", ErrStateLost, n.subject, prev, tried)
	}
	if unread != nil {
		n.log.Warn("replica: checkpoints cannot be read now; the subject starts at its first record: replaying it", "err", unread)
	}
	p, err := n.cfg.NewPool()
	if err != nil {
		return Pool{}, origin{}, fmt.Errorf("replica: new pool: %w", err)
	}
	return p, origin{}, nil
}

// checkpoint takes the pool's image at rec's boundary — the export is
// queued behind every command of the records applied, so it includes them
// and nothing after — and stores it in the background (one store at a
// time), then purges the subject below the older kept checkpoint.
func (n *Node) checkpoint(ctx context.Context, p Pool, rec Record) error {
	img, err := p.Handle.ExportImage(ctx)
	if err != nil {
		return fmt.Errorf("replica: checkpoint image: %w", err)
	}
	st := n.Status()
	ck := &Checkpoint{Seq: rec.Seq, Term: rec.Term, Leader: TermRecord{Node: st.Leader, Address: st.Address}, Cursors: n.Cursors(), Image: img}
	n.sinceRecords, n.sinceBytes = 0, 0
	n.storing.Store(true)
	n.stores.Add(1)
	go func() {
		defer n.stores.Done()
		defer n.storing.Store(false)
		ctx, cancel := context.WithTimeout(ctx, checkpointStoreTimeout)
		defer cancel()
		size, below, err := n.cfg.Checkpoints.Put(ctx, n.cfg.Pool, ck)
		if err != nil {
			n.log.Warn("replica: storing a checkpoint", "checkpoint", ck.Seq, "err", err)
			return
		}
		n.update(func(s *Status) { s.Checkpoint = ck.Seq })
		if err := Purge(ctx, n.cfg.Stream, n.subject, below); err != nil {
			n.log.Warn("replica: purging below a checkpoint", "below", below, "err", err)
			return
		}
		if below > 1 {
			n.update(func(s *Status) { s.PurgedBelow = max(s.PurgedBelow, below) })
		}
		n.log.Info("replica: stored a checkpoint", "checkpoint", ck.Seq, "bytes", size, "purged_below", below)
		sctx, scancel := context.WithTimeout(ctx, checkpointSweepTimeout)
		defer scancel()
		if swept, err := n.cfg.Checkpoints.Sweep(sctx, n.cfg.Pool, below); err != nil {
			n.log.Warn("replica: sweeping checkpoints no index names (the next checkpoint tries again)", "below", below, "err", err)
		} else if swept > 0 {
			n.log.Info("replica: deleted checkpoints no index names", "below", below, "deleted", swept)
		}
	}()
	return nil
}

// noteCursors keeps the cursors of cmds (records applied or appended).
func (n *Node) noteCursors(cmds []Command) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for i := range cmds {
		c := &cmds[i].Cursor
		if cmds[i].Kind != KindCursor {
			continue
		}
		if _, ok := n.cursors[c.Source]; ok || len(n.cursors) < MaxCursorSources {
			n.cursors[c.Source] = c.Seq
		}
	}
}

// Cursors returns, by source, how far each source's stream is in the
// records this replica applied (a standby) or appended (the leader): a
// new leader's sources resume after them (a ZMQ source asks the engine's
// replay socket for everything after its cursor).
func (n *Node) Cursors() []producer.Cursor {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]producer.Cursor, 0, len(n.cursors))
	for src, seq := range n.cursors {
		out = append(out, producer.Cursor{Source: src, Seq: seq})
	}
	slices.SortFunc(out, func(a, b producer.Cursor) int { return strings.Compare(a.Source, b.Source) })
	return out
}
