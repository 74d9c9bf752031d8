// Package hub fans one pool's publication stream out to any number of remote
// subscribers (SPEC §11).
//
// The relay holds exactly one lease on a pool's publisher. The hub consumes
// that lease's snapshot and deltas, keeps a mirror of the table, and serves
// each remote subscriber a snapshot taken from the mirror at the mirror's
// sequence followed by every later delta, re-stamped with the subscriber's
// own lease. Each subscriber has a bounded queue: one that falls behind is
// closed with [ErrLagged] and must resubscribe with a higher epoch. Nothing is
// ever silently skipped.
//
// A Hub is safe for concurrent use: one goroutine feeds it ([Hub.Install],
// [Hub.Apply], [Hub.Close]) while any number subscribe and read.
package hub

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// Errors a subscription ends with, and subscribe refusals.
var (
	// ErrLagged: the subscriber's queue overflowed; resubscribe with a higher epoch.
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
	// ErrStaleEpoch: a lane's new lease must have a higher assignment epoch
	// than any lease that consumer lane held on this hub.
	ErrStaleEpoch = errors.New("hub: stale assignment epoch")
	// ErrBrokenStream: a delta did not continue the mirror's sequence; the hub
	// must be re-installed from a new snapshot.
	ErrBrokenStream = errors.New("hub: delta does not continue the mirror")
	// ErrSuperseded: the same (consumer, lane) subscribed again under a higher
	// epoch, so this older stream is fenced. Typically the router gave up on
	// a half-open connection (its idle timeout) and resubscribed; the old
	// stream is a zombie whose slot and queue go to the new one at once.
	ErrSuperseded = errors.New("hub: superseded by a newer lease on the same lane")
)

// Config bounds a hub. The zero value is not valid; start from [DefaultConfig].
type Config struct {
	// QueueDeltas is each subscriber's bounded queue, in deltas.
	QueueDeltas int
	// MaxSubscribers bounds concurrent subscriptions. Memory per subscriber
	// is its queue (QueueDeltas pointers, 8 bytes each, allocated up front)
	// plus the deltas it has not read yet, which every subscriber shares;
	// snapshots are shared too (see [Hub.Subscribe]).
	MaxSubscribers int
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

// DefaultMaxLeaseRecords is the lease-record cap when Config leaves it zero.
const DefaultMaxLeaseRecords = 65536

// DefaultConfig returns a 4096-delta queue, 256 subscribers and
// [DefaultMaxLeaseRecords] lease records.
func DefaultConfig() Config {
	return Config{QueueDeltas: 4096, MaxSubscribers: 256, MaxLeaseRecords: DefaultMaxLeaseRecords}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.QueueDeltas < 1 {
		return fmt.Errorf("hub: queue deltas %d < 1", c.QueueDeltas)
	}
	if c.MaxSubscribers < 1 {
		return fmt.Errorf("hub: max subscribers %d < 1", c.MaxSubscribers)
	}
	if c.MaxLeaseRecords != 0 && c.MaxLeaseRecords < c.MaxSubscribers {
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

// Hub mirrors one pool's table and fans deltas out.
type Hub struct {
	cfg Config

	mu       sync.Mutex
	ready    bool
	closed   bool
	identity ckf.ProducerIdentity
	words    []uint64
	shared   bool // words is lent to a snapshot: copy before the next write
	sequence uint64
	subs     map[*Subscription]struct{}
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
	return &Hub{cfg: cfg, subs: make(map[*Subscription]struct{}), lanes: make(map[laneKey]laneRecord)}, nil
}

// Install replaces the mirror with snap (the hub's own lease's snapshot). Every
// existing subscription ends with ErrProducerChanged: its sequence continuity
// with the new stream is not guaranteed. The hub keeps snap.Words.
func (h *Hub) Install(snap ckf.Snapshot) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closeAllLocked(ErrProducerChanged)
	h.identity = snap.Identity
	h.words = snap.Words
	h.shared = false
	h.sequence = snap.Sequence
	h.ready = !h.closed
}

// Apply advances the mirror by one delta of the hub's stream and queues it to
// every subscriber. A delta that does not continue the mirror makes the hub
// not ready, ends every subscription with ErrBrokenStream and returns it; the
// owner must re-install. d.Images must not be modified afterwards: queued
// deltas share it.
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
	if h.shared {
		// Copy on write: snapshots handed out since the last delta keep the
		// old array, however many subscribers share it.
		h.words = slices.Clone(h.words)
		h.shared = false
	}
	for _, im := range d.Images {
		h.words[im.Bucket] = im.Word
	}
	h.sequence = d.Sequence
	// One copy of the delta is queued to every subscriber; each stamps its
	// own lease when it takes it (Subscription.Stamp), so a queue costs a
	// pointer per slot, not a delta.
	shared := &d
	for s := range h.subs {
		select {
		case s.deltas <- shared:
		default:
			h.endLocked(s, ErrLagged)
		}
	}
	return nil
}

// Close ends every subscription with ErrClosed (or cause, when non-nil) and
// refuses new ones.
func (h *Hub) Close(cause error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed, h.ready = true, false
	h.closeAllLocked(cmpErr(cause, ErrClosed))
}

// Subscribe grants lease a snapshot of the mirror at its current sequence and
// a subscription carrying every later delta. The lease's assignment epoch must
// exceed every epoch the same (consumer, lane) held on this hub (as far as the
// hub remembers: see below), else it fails with [ErrStaleEpoch].
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
//
// The snapshot's Words are shared with the hub and with every other
// subscriber served since the last delta (the hub copies on its next write),
// so a flood of subscribers costs one table copy, not one each. The caller
// must not modify them.
func (h *Hub) Subscribe(lease ckf.LaneLease) (ckf.Snapshot, *Subscription, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.closed:
		return ckf.Snapshot{}, nil, ErrClosed
	case !h.ready:
		return ckf.Snapshot{}, nil, ErrNotReady
	}
	key := laneKey{lease.ConsumerInstance, lease.PhysicalLane}
	rec, known := h.lanes[key]
	if known && lease.AssignmentEpoch <= rec.epoch {
		return ckf.Snapshot{}, nil, fmt.Errorf("%w: epoch %d, last granted %d", ErrStaleEpoch, lease.AssignmentEpoch, rec.epoch)
	}
	used := len(h.subs)
	if rec.live != nil {
		used-- // its slot passes to this grant
	}
	if used >= h.cfg.MaxSubscribers {
		return ckf.Snapshot{}, nil, ErrTooManySubscribers
	}
	if rec.live != nil {
		h.endLocked(rec.live, ErrSuperseded)
	}
	s := &Subscription{hub: h, lease: lease, deltas: make(chan *ckf.Delta, h.cfg.QueueDeltas), done: make(chan struct{})}
	h.subs[s] = struct{}{}
	h.lanes[key] = laneRecord{epoch: lease.AssignmentEpoch, live: s}
	if len(h.lanes) > h.cfg.MaxLeaseRecords {
		h.pruneLocked()
	}
	h.shared = true
	snap := ckf.Snapshot{Identity: h.identity, Lease: lease, Sequence: h.sequence, Words: h.words}
	return snap, s, nil
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
}

// Stats returns the hub's state.
func (h *Hub) Stats() Stats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return Stats{Ready: h.ready, Sequence: h.sequence, Subscribers: len(h.subs), LeaseRecords: len(h.lanes)}
}

func (h *Hub) closeAllLocked(cause error) {
	for s := range h.subs {
		h.endLocked(s, cause)
	}
}

// endLocked ends s with cause. Queued deltas stay readable before the cause.
func (h *Hub) endLocked(s *Subscription, cause error) {
	if _, ok := h.subs[s]; !ok {
		return
	}
	delete(h.subs, s)
	key := laneKey{s.lease.ConsumerInstance, s.lease.PhysicalLane}
	if rec, ok := h.lanes[key]; ok && rec.live == s {
		rec.live = nil
		h.lanes[key] = rec // keep the epoch: the lane may only move forward
	}
	s.err = cause
	close(s.done)
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
