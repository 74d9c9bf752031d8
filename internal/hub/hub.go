// Package hub fans one pool's publication stream out to any number of remote
// subscribers (SPEC §11).
//
// The relay holds exactly one lease on a pool's publisher. The hub consumes
// that lease's snapshot and deltas, keeps a mirror of the table, and serves
// each remote subscriber a snapshot followed by every later delta, re-stamped
// with the subscriber's own lease. Nothing is ever silently skipped.
//
// Memory is bounded whatever the subscribers do:
//   - Snapshots are immutable generations of the mirror, shared by every
//     subscriber that starts from them: at most Config.SnapshotGenerations
//     live at once, and a generation is freed as soon as its last reader has
//     copied out its last chunk or ended. A subscriber reads its snapshot
//     through [Subscription.ReadSnapshot], a chunk at a time, so a slow or
//     stalled writer holds one chunk, never a table.
//   - Deltas go into one log shared by every subscriber, bounded by
//     Config.QueueDeltas and Config.QueueBytes; each subscriber is a cursor
//     into it. A subscriber whose cursor falls off the log's tail is closed
//     with [ErrLagged] and must resubscribe with a higher epoch. Because the
//     log is shared and sized in bytes, a slow link that needs seconds for its
//     snapshot finds every delta since still there when it is done, and
//     catches up if it reads faster than the pool changes (docs/RATIONALE.md,
//     "Why do snapshots come from shared generations and deltas from one shared log?").
//
// A Hub is safe for concurrent use: one goroutine feeds it ([Hub.Install],
// [Hub.Apply], [Hub.Close]) while any number subscribe and read.
package hub

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"unsafe"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// Errors a subscription ends with, and subscribe refusals.
var (
	// ErrLagged: the subscriber fell behind the shared delta log (or its
	// snapshot's generation left it); resubscribe with a higher epoch.
	ErrLagged = errors.New("hub: subscriber lagged")
	// ErrProducerChanged: the hub re-installed from a new snapshot (new
	// producer incarnation or a new publisher lease); resubscribe.
	ErrProducerChanged = errors.New("hub: producer changed")
	// ErrClosed: the hub shut down.
	ErrClosed = errors.New("hub: closed")
	// ErrNotReady: the hub has no snapshot yet.
	ErrNotReady = errors.New("hub: not ready")
	// ErrTooManySubscribers: the subscriber limit is reached.
	ErrTooManySubscribers = errors.New("hub: too many subscribers")
	// ErrClientShare: the subscriber's client address holds its share of
	// the subscriber slots (Config.MaxSubscribersPerClient). It wraps
	// ErrTooManySubscribers, so callers that answer the pool's limit answer
	// this one too.
	ErrClientShare = fmt.Errorf("%w: client address at its share (max subscribers per client)", ErrTooManySubscribers)
	// ErrStaleEpoch: a lane's new lease must have a higher assignment epoch
	// than any lease that consumer lane held on this hub.
	ErrStaleEpoch = errors.New("hub: stale assignment epoch")
	// ErrBrokenStream: a delta did not continue the mirror's sequence; the hub
	// must be re-installed from a new snapshot.
	ErrBrokenStream = errors.New("hub: delta does not continue the mirror")
	// ErrSuperseded: the same (consumer, lane) subscribed again under a higher
	// epoch, so this older stream is fenced. Typically the router gave up on
	// a half-open connection (its idle timeout) and resubscribed; the old
	// stream is a zombie whose slot goes to the new one at once.
	ErrSuperseded = errors.New("hub: superseded by a newer lease on the same lane")
)

// Config bounds a hub. The zero value is not valid; start from [DefaultConfig].
type Config struct {
	// QueueDeltas bounds the shared delta log, in deltas: how far any
	// subscriber may trail the mirror. A slot costs one pointer, and the
	// log only holds what the furthest-behind subscriber still needs.
	QueueDeltas int
	// QueueBytes bounds the shared delta log's memory (deltas and their
	// images, estimated from their sizes). Zero means [DefaultQueueBytes].
	QueueBytes int64
	// SnapshotGenerations bounds the immutable table copies that snapshots
	// in flight share (each costs one table). A new subscriber starts from
	// the newest generation while the log still holds its continuation with
	// room to spare, else from a new one; at the bound it starts from the
	// newest anyway. Zero means [DefaultSnapshotGenerations].
	SnapshotGenerations int
	// MaxSubscribers bounds concurrent subscriptions. A subscriber costs a
	// cursor; the log and the generations are shared.
	MaxSubscribers int
	// MaxSubscribersPerClient, when > 0, bounds the subscriptions one client
	// address holds ([Hub.SubscribeFrom]), so one address cannot take every
	// slot and lock the others out. Zero: no such bound. At most
	// MaxSubscribers.
	MaxSubscribersPerClient int
	// MaxLeaseRecords bounds the per-(consumer, lane) lease records (highest
	// granted epoch, live subscription) the hub keeps. Their keys are chosen
	// by clients, so without a bound a stream of subscribe-then-cancel calls
	// under fresh consumer ids would grow them forever. When a grant takes
	// the count past this cap, every record without a live subscription is
	// dropped (see [Hub.Subscribe]). Must be at least MaxSubscribers, so
	// that live records alone always fit. Zero means
	// [DefaultMaxLeaseRecords] (or MaxSubscribers if larger); a record costs
	// about 60 bytes of map space.
	MaxLeaseRecords int
}

// Defaults for a zero field of Config.
const (
	DefaultMaxLeaseRecords     = 65536
	DefaultQueueBytes          = 64 << 20
	DefaultSnapshotGenerations = 2
)

// DefaultConfig returns a 65,536-delta, 64 MiB shared log, two snapshot
// generations, 256 subscribers and [DefaultMaxLeaseRecords] lease records.
func DefaultConfig() Config {
	return Config{QueueDeltas: 65536, QueueBytes: DefaultQueueBytes, SnapshotGenerations: DefaultSnapshotGenerations,
		MaxSubscribers: 256, MaxLeaseRecords: DefaultMaxLeaseRecords}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	switch {
	case c.QueueDeltas < 1:
		return fmt.Errorf("hub: queue deltas %d < 1", c.QueueDeltas)
	case c.QueueBytes < 0:
		return fmt.Errorf("hub: queue bytes %d < 0", c.QueueBytes)
	case c.SnapshotGenerations < 0:
		return fmt.Errorf("hub: snapshot generations %d < 0", c.SnapshotGenerations)
	case c.MaxSubscribers < 1:
		return fmt.Errorf("hub: max subscribers %d < 1", c.MaxSubscribers)
	case c.MaxSubscribersPerClient < 0 || c.MaxSubscribersPerClient > c.MaxSubscribers:
		return fmt.Errorf("hub: max subscribers per client %d outside 0..%d", c.MaxSubscribersPerClient, c.MaxSubscribers)
	case c.MaxLeaseRecords != 0 && c.MaxLeaseRecords < c.MaxSubscribers:
		return fmt.Errorf("hub: max lease records %d < max subscribers %d", c.MaxLeaseRecords, c.MaxSubscribers)
	}
	return nil
}

type laneKey struct {
	consumer uint64
	lane     uint8
}

// laneRecord is what the hub remembers of one (consumer, lane).
type laneRecord struct {
	epoch uint64        // highest epoch granted
	live  *Subscription // the subscription under that epoch while it lasts, else nil
}

// generation is an immutable copy of the mirror at seq that snapshots in
// flight read from.
type generation struct {
	seq     uint64
	words   []uint64
	readers int // subscriptions still reading it; the generation goes at 0
}

// Hub mirrors one pool's table and fans deltas out.
type Hub struct {
	cfg Config

	mu       sync.Mutex
	ready    bool
	closed   bool
	identity ckf.ProducerIdentity
	epoch    uint64   // assignment epoch of the lease the installed snapshot came under
	words    []uint64 // the mirror; never lent out
	sequence uint64
	gens     []*generation // live generations, oldest first
	log      deltaLog
	wake     chan struct{} // closed (and replaced) when readers may have news
	subs     map[*Subscription]struct{}
	byClient map[string]int         // live subscriptions per client address (SubscribeFrom); ≤ MaxSubscribers entries
	lanes    map[laneKey]laneRecord // bounded by cfg.MaxLeaseRecords
}

// New returns an empty hub; subscribers are refused until [Hub.Install].
func New(cfg Config) (*Hub, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxLeaseRecords == 0 {
		cfg.MaxLeaseRecords = max(DefaultMaxLeaseRecords, cfg.MaxSubscribers)
	}
	if cfg.QueueBytes == 0 {
		cfg.QueueBytes = DefaultQueueBytes
	}
	if cfg.SnapshotGenerations == 0 {
		cfg.SnapshotGenerations = DefaultSnapshotGenerations
	}
	return &Hub{cfg: cfg, wake: make(chan struct{}), subs: make(map[*Subscription]struct{}), byClient: map[string]int{}, lanes: make(map[laneKey]laneRecord)}, nil
}

// Install replaces the mirror with snap (the hub's own lease's snapshot). Every
// existing subscription ends with ErrProducerChanged: its sequence continuity
// with the new stream is not guaranteed. The hub keeps snap.Words.
func (h *Hub) Install(snap ckf.Snapshot) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closeAllLocked(ErrProducerChanged)
	h.identity = snap.Identity
	h.epoch = snap.Lease.AssignmentEpoch
	h.words = snap.Words
	h.sequence = snap.Sequence
	h.gens = nil
	h.log.reset(snap.Sequence)
	h.ready = !h.closed
	h.wakeLocked() // Watch
}

// Apply advances the mirror by one delta of the hub's stream and appends it to
// the shared log. A delta that does not continue the mirror makes the hub not
// ready, ends every subscription with ErrBrokenStream and returns it; the
// owner must re-install. d.Images must not be modified afterwards: the log
// shares it with every subscriber.
func (h *Hub) Apply(d ckf.Delta) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.ready {
		return ErrNotReady
	}
	if d.Identity != h.identity || d.BaseSequence != h.sequence || d.Sequence != h.sequence+1 {
		h.ready = false
		h.closeAllLocked(ErrBrokenStream)
		return fmt.Errorf("%w: mirror at %d, delta %d→%d", ErrBrokenStream, h.sequence, d.BaseSequence, d.Sequence)
	}
	for _, im := range d.Images {
		if uint64(im.Bucket) >= uint64(len(h.words)) {
			h.ready = false
			h.closeAllLocked(ErrBrokenStream)
			return fmt.Errorf("%w: image bucket %d out of range", ErrBrokenStream, im.Bucket)
		}
	}
	// Generations are copies, so the mirror is written in place.
	for _, im := range d.Images {
		h.words[im.Bucket] = im.Word
	}
	h.sequence = d.Sequence
	// One copy of the delta serves every subscriber; each stamps its own
	// lease when it takes it (Subscription.Next).
	h.log.push(&d)
	h.trimLocked()
	h.wakeLocked()
	return nil
}

// trimLocked drops the log's oldest deltas that nobody needs, then, while the
// log is over its bounds, the oldest ones anyway: the subscribers that needed
// them end lagged, and generations whose continuation is gone are released.
func (h *Hub) trimLocked() {
	need := h.sequence // no subscriber: keep nothing
	for s := range h.subs {
		need = min(need, s.at)
	}
	h.log.dropThrough(need)
	if h.log.len() <= h.cfg.QueueDeltas && h.log.bytes <= h.cfg.QueueBytes {
		return
	}
	for h.log.len() > 0 && (h.log.len() > h.cfg.QueueDeltas || h.log.bytes > h.cfg.QueueBytes) {
		h.log.dropThrough(h.log.base + 1)
	}
	need = h.sequence
	for s := range h.subs {
		if s.at < h.log.base {
			h.endLocked(s, ErrLagged)
		} else {
			need = min(need, s.at)
		}
	}
	h.log.dropThrough(need)
}

// Close ends every subscription with ErrClosed (or cause, when non-nil) and
// refuses new ones.
func (h *Hub) Close(cause error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed, h.ready = true, false
	h.closeAllLocked(cmpErr(cause, ErrClosed))
	h.wakeLocked() // Watch
}

// Subscribe grants lease a snapshot and a subscription carrying every later
// delta. The lease's assignment epoch must exceed every epoch the same
// (consumer, lane) held on this hub (as far as the hub remembers: see below),
// else it fails with [ErrStaleEpoch].
//
// The snapshot is an immutable generation of the mirror, shared with the
// other subscribers that start from it (see Config.SnapshotGenerations): it
// may be a little older than the mirror, and the subscription then begins
// with the deltas since. Read it with [Subscription.ReadSnapshot].
//
// A (consumer, lane) has at most one live subscription: a grant under a
// higher epoch ends the older one with [ErrSuperseded], and the older one's
// slot counts as free for the grant, so a router replacing a half-open
// stream is never refused for the zombie's slot.
//
// The hub keeps at most cfg.MaxLeaseRecords (consumer, lane) records. When a
// grant takes the count past the cap, every record without a live
// subscription is forgotten, all at once: that bounds the memory with no
// recency bookkeeping per record, costs O(records) once per at least
// MaxLeaseRecords−MaxSubscribers new lanes, and oldest-first would buy little
// since clients choose the keys and can flush any order. Forgetting an idle
// lane's last epoch is safe for consistency: the consumer refuses a
// non-increasing epoch on its own, so a stale lease the hub then grants can
// neither regress nor take over the lane; at worst it holds a slot until its
// stream ends. Live records are never dropped, so superseding still works.
func (h *Hub) Subscribe(lease ckf.LaneLease) (*Subscription, error) {
	return h.SubscribeFrom(lease, "")
}

// SubscribeFrom is [Hub.Subscribe] for a subscriber at client address
// client: with Config.MaxSubscribersPerClient set, an address holding that
// many live subscriptions is refused with [ErrClientShare] (a grant that
// supersedes the same address's subscription on its lane takes that one's
// share, as it takes its slot). An empty client is charged to no address.
func (h *Hub) SubscribeFrom(lease ckf.LaneLease, client string) (*Subscription, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.closed:
		return nil, ErrClosed
	case !h.ready:
		return nil, ErrNotReady
	}
	key := laneKey{lease.ConsumerInstance, lease.PhysicalLane}
	rec, known := h.lanes[key]
	if known && lease.AssignmentEpoch <= rec.epoch {
		return nil, fmt.Errorf("%w: epoch %d, last granted %d", ErrStaleEpoch, lease.AssignmentEpoch, rec.epoch)
	}
	used := len(h.subs)
	if rec.live != nil {
		used-- // its slot passes to this grant
	}
	if used >= h.cfg.MaxSubscribers {
		return nil, ErrTooManySubscribers
	}
	if client != "" && h.cfg.MaxSubscribersPerClient > 0 {
		own := h.byClient[client]
		if rec.live != nil && rec.live.client == client {
			own--
		}
		if own >= h.cfg.MaxSubscribersPerClient {
			return nil, ErrClientShare
		}
	}
	if rec.live != nil {
		h.endLocked(rec.live, ErrSuperseded)
	}
	g := h.generationLocked()
	g.readers++
	s := &Subscription{hub: h, lease: lease, client: client, gen: g, at: g.seq, done: make(chan struct{}),
		snap: ckf.Snapshot{Identity: h.identity, Lease: lease, Sequence: g.seq}}
	h.subs[s] = struct{}{}
	if client != "" {
		h.byClient[client]++
	}
	h.lanes[key] = laneRecord{epoch: lease.AssignmentEpoch, live: s}
	if len(h.lanes) > h.cfg.MaxLeaseRecords {
		h.pruneLocked()
	}
	return s, nil
}

// generationLocked returns the generation a new subscriber starts from: the
// newest while the log behind it is at most half full (so the subscriber has
// the other half to read its snapshot in), else a new copy of the mirror
// unless SnapshotGenerations are live already.
func (h *Hub) generationLocked() *generation {
	if n := len(h.gens); n > 0 {
		g := h.gens[n-1]
		behind := h.log.since(g.seq)
		fresh := g.seq == h.sequence ||
			(behind.deltas <= h.cfg.QueueDeltas/2 && behind.bytes <= h.cfg.QueueBytes/2)
		if fresh || n >= h.cfg.SnapshotGenerations {
			return g
		}
	}
	g := &generation{seq: h.sequence, words: slices.Clone(h.words)}
	h.gens = append(h.gens, g)
	return g
}

// releaseLocked drops s's hold on its generation, freeing the generation
// with its last reader.
func (h *Hub) releaseLocked(s *Subscription) {
	g := s.gen
	if g == nil {
		return
	}
	s.gen = nil
	if g.readers--; g.readers == 0 {
		g.words = nil
		h.gens = slices.DeleteFunc(h.gens, func(x *generation) bool { return x == g })
	}
}

// pruneLocked forgets every lane record without a live subscription (see
// [Hub.Subscribe] for why all of them and why that is safe).
func (h *Hub) pruneLocked() {
	for k, rec := range h.lanes {
		if rec.live == nil {
			delete(h.lanes, k)
		}
	}
}

// Stats is a point-in-time view of a hub.
type Stats struct {
	Ready       bool
	Sequence    uint64
	Subscribers int
	// LeaseRecords is how many (consumer, lane) lease records the hub holds,
	// at most Config.MaxLeaseRecords.
	LeaseRecords int
	// SnapshotGenerations and SnapshotBytes are the table copies snapshots
	// in flight share, at most Config.SnapshotGenerations.
	SnapshotGenerations int
	SnapshotBytes       int64
	// LogDeltas and LogBytes are the shared delta log's length and estimated
	// size, within Config.QueueDeltas and Config.QueueBytes.
	LogDeltas int
	LogBytes  int64
}

// Stats returns the hub's state.
func (h *Hub) Stats() Stats {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := Stats{Ready: h.ready, Sequence: h.sequence, Subscribers: len(h.subs), LeaseRecords: len(h.lanes),
		SnapshotGenerations: len(h.gens), LogDeltas: h.log.len(), LogBytes: h.log.bytes}
	for _, g := range h.gens {
		st.SnapshotBytes += int64(8 * len(g.words))
	}
	return st
}

func (h *Hub) closeAllLocked(cause error) {
	for s := range h.subs {
		h.endLocked(s, cause)
	}
}

// endLocked ends s with cause. Unless s lagged, was superseded or cancelled,
// the deltas it has not read yet stay readable before the cause.
func (h *Hub) endLocked(s *Subscription, cause error) {
	if _, ok := h.subs[s]; !ok {
		return
	}
	delete(h.subs, s)
	if s.client != "" {
		if h.byClient[s.client]--; h.byClient[s.client] <= 0 {
			delete(h.byClient, s.client)
		}
	}
	key := laneKey{s.lease.ConsumerInstance, s.lease.PhysicalLane}
	if rec, ok := h.lanes[key]; ok && rec.live == s {
		rec.live = nil
		h.lanes[key] = rec // keep the epoch: the lane may only move forward
	}
	if keepsTail(cause) && s.gen == nil && s.at >= h.log.base {
		s.tail = h.log.after(s.at)
	}
	h.releaseLocked(s)
	s.err = cause
	close(s.done)
	h.wakeLocked()
}

// keepsTail reports whether a subscription ended by cause may still read the
// deltas it had not read: not after a gap (lagged), a fence (superseded) or
// its own cancel.
func keepsTail(cause error) bool {
	return !errors.Is(cause, ErrLagged) && !errors.Is(cause, ErrSuperseded) && !errors.Is(cause, errCanceled)
}

// wakeLocked wakes every reader waiting for news.
func (h *Hub) wakeLocked() {
	close(h.wake)
	h.wake = make(chan struct{})
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// deltaLog is the shared, ordered log of the deltas after sequence base:
// entry i carries sequence base+1+i.
type deltaLog struct {
	entries []*ckf.Delta
	head    int // entries[:head] are dropped
	base    uint64
	bytes   int64
}

// deltaBytes estimates what a logged delta costs.
func deltaBytes(d *ckf.Delta) int64 {
	return int64(unsafe.Sizeof(*d)) + int64(cap(d.Images))*int64(unsafe.Sizeof(ckf.BucketImage{})) + 8
}

func (l *deltaLog) reset(base uint64) { *l = deltaLog{base: base} }

func (l *deltaLog) len() int { return len(l.entries) - l.head }

func (l *deltaLog) push(d *ckf.Delta) {
	l.entries = append(l.entries, d)
	l.bytes += deltaBytes(d)
}

// dropThrough drops the deltas up to and including sequence seq.
func (l *deltaLog) dropThrough(seq uint64) {
	for l.len() > 0 && l.base < seq {
		d := l.entries[l.head]
		l.entries[l.head] = nil
		l.head++
		l.bytes -= deltaBytes(d)
		l.base = d.Sequence
	}
	if l.head > 0 && l.head >= len(l.entries)/2 {
		// Compact once half is dead: amortised O(1) a delta.
		n := copy(l.entries, l.entries[l.head:])
		clear(l.entries[n:])
		l.entries = l.entries[:n]
		l.head = 0
	}
}

// get returns the delta whose base is seq; base ≤ seq < base+len.
func (l *deltaLog) get(seq uint64) *ckf.Delta { return l.entries[l.head+int(seq-l.base)] }

// after returns the deltas after seq, in order (a copy of the pointers).
func (l *deltaLog) after(seq uint64) []*ckf.Delta {
	return slices.Clone(l.entries[l.head+int(seq-l.base):])
}

type backlog struct {
	deltas int
	bytes  int64
}

// since measures the deltas after seq.
func (l *deltaLog) since(seq uint64) backlog {
	var b backlog
	for _, d := range l.entries[l.head+int(seq-l.base):] {
		b.deltas++
		b.bytes += deltaBytes(d)
	}
	return b
}
