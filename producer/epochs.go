package producer

import (
	"fmt"
	"sync"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// MaxSourceEpoch is the highest source epoch a reset or replacement may
// announce (2^62). Epochs are counters or Unix nanoseconds (2^62 ns is the
// year 2116), so the bound costs no real source anything; what it buys is
// that repeated announcements, each within a bounded step, cannot climb a
// member's epoch to 2^64−1 and leave its real source no higher epoch to
// announce: past the ceiling the announcement is refused with
// [ErrEpochOutOfRange], an error the caller sees, and 2^64−2^62 epochs stay
// unused rather than wrapping.
const MaxSourceEpoch = 1 << 62

// checkEpochRange refuses an announced epoch above MaxSourceEpoch.
func checkEpochRange(epoch uint64, m ckf.Member) error {
	if epoch > MaxSourceEpoch {
		return fmt.Errorf("%w: source epoch %d of worker %d rank %d is above the ceiling %d",
			ErrEpochOutOfRange, epoch, m.WorkerID, m.DPRank, uint64(MaxSourceEpoch))
	}
	return nil
}

// sourceEpochs is the actor's record of each member's source epoch
// (SPEC §7). A member's record lives as long as the member holds blocks.
// Once it holds nothing the record turns idle: it is kept, so a late event
// of an older incarnation is still recognised as stale, but only among the
// maxIdle most recently idle records — the least recently idle one is
// pruned beyond that. Without the bound every member that ever sent an
// event (409,600 distinct workers sending "cleared", in one attack) would
// keep a record forever.
//
// A pruned member is unknown again: its next event sets the epoch, as at
// pool start (SPEC §7, decision on pruned epochs). Written only by the actor
// goroutine, which reads without locking; other goroutines (a Handle checking
// a batch before admission) read through [sourceEpochs.load].
//
// The idle records form a list threaded through the records themselves, so
// a member emptying and refilling allocates nothing, and the actor's hot
// path looks a member up once per event ([sourceEpochs.lookup]) and then
// works on its record.
type sourceEpochs struct {
	mu      sync.RWMutex // held for writes to rec and to an epoch, and by load
	rec     map[ckf.Member]*epochRecord
	idle    epochRecord // the idle list's sentinel: idle.next is the least recently idle
	idleLen int
	maxIdle int
	pruned  uint64
	// recent caches records by a cheap hash of their member, in front of
	// the map (whose hash of a Member is most of a lookup's cost): the
	// actor looks a member up for every event. A slot is cleared when its
	// record is deleted. Actor goroutine only.
	recent [recentSlots]*epochRecord
}

// recentSlots is the size of sourceEpochs.recent (2 KiB of pointers).
const recentSlots = 256

// recentSlot is m's slot in sourceEpochs.recent: a multiply-shift hash of
// both fields.
func recentSlot(m ckf.Member) int {
	return int((m.WorkerID*0x9E3779B97F4A7C15 ^ uint64(m.DPRank)*0xC2B2AE3D27D4EB4F) >> 56)
}

type epochRecord struct {
	member     ckf.Member
	epoch      uint64
	prev, next *epochRecord // in the idle list; nil while the member holds blocks
	deleted    bool         // forgotten or pruned: no longer in rec
}

func (r *epochRecord) isIdle() bool { return r.next != nil }

func newSourceEpochs(maxIdle int) *sourceEpochs {
	s := &sourceEpochs{rec: make(map[ckf.Member]*epochRecord), maxIdle: maxIdle}
	s.idle.prev, s.idle.next = &s.idle, &s.idle
	return s
}

// get returns m's epoch; ok is false when m has no record.
func (s *sourceEpochs) get(m ckf.Member) (epoch uint64, ok bool) {
	if r := s.rec[m]; r != nil {
		return r.epoch, true
	}
	return 0, false
}

// lookup returns m's record, nil when it has none. Actor goroutine only.
func (s *sourceEpochs) lookup(m ckf.Member) *epochRecord {
	slot := &s.recent[recentSlot(m)]
	if r := *slot; r != nil && r.member == m {
		return r
	}
	r := s.rec[m]
	if r != nil {
		*slot = r
	}
	return r
}

// load is get for goroutines other than the actor's.
func (s *sourceEpochs) load(m ckf.Member) (epoch uint64, ok bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.get(m)
}

// set records epoch for m and returns its record. A new record is not idle
// until [sourceEpochs.settle] says so.
func (s *sourceEpochs) set(m ckf.Member, epoch uint64) *epochRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.rec[m]; r != nil {
		r.epoch = epoch
		return r
	}
	r := &epochRecord{member: m, epoch: epoch}
	s.rec[m] = r
	return r
}

// forget removes r's record (one set by an event that then faulted).
func (s *sourceEpochs) forget(r *epochRecord) {
	if r.deleted {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.isIdle() {
		s.unlinkIdle(r)
	}
	s.delete(r)
}

// delete drops r from the map; s.mu is held.
func (s *sourceEpochs) delete(r *epochRecord) {
	delete(s.rec, r.member)
	r.deleted = true
	if slot := &s.recent[recentSlot(r.member)]; *slot == r {
		*slot = nil
	}
}

// settle updates r's record after a command changed what its member holds:
// a member holding blocks is never pruned; one holding nothing becomes the
// most recently idle, and the least recently idle records beyond maxIdle go.
func (s *sourceEpochs) settle(r *epochRecord, holds bool) {
	// The idle list is the actor's alone (no other goroutine reads it), so
	// only a pruning, which deletes from the map, takes the lock; the
	// common case — a member that holds blocks and is not idle — changes
	// nothing.
	if r == nil || r.deleted || (holds && !r.isIdle()) {
		return
	}
	if r.isIdle() {
		s.unlinkIdle(r)
	}
	if holds {
		return
	}
	s.pushIdle(r)
	if s.idleLen > s.maxIdle {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.pruneIdle()
	}
}

// pushIdle appends r as the most recently idle record. Actor goroutine
// only (or before it runs).
func (s *sourceEpochs) pushIdle(r *epochRecord) {
	r.prev, r.next = s.idle.prev, &s.idle
	s.idle.prev.next = r
	s.idle.prev = r
	s.idleLen++
}

// unlinkIdle takes r out of the idle list. Actor goroutine only.
func (s *sourceEpochs) unlinkIdle(r *epochRecord) {
	r.prev.next = r.next
	r.next.prev = r.prev
	r.prev, r.next = nil, nil
	s.idleLen--
}

// pruneIdle deletes the least recently idle records beyond maxIdle; s.mu is
// held (or the actor is not running yet).
func (s *sourceEpochs) pruneIdle() {
	for s.idleLen > s.maxIdle {
		old := s.idle.next
		s.unlinkIdle(old)
		s.delete(old)
		s.pruned++
	}
}

// idleRecords calls f on each idle record, least recently idle first.
func (s *sourceEpochs) idleRecords(f func(r *epochRecord)) {
	for r := s.idle.next; r != &s.idle; r = r.next {
		f(r)
	}
}

// noPruneWithin reports whether n more settles cannot prune a record: each
// adds at most one idle record. Actor goroutine only.
func (s *sourceEpochs) noPruneWithin(n int) bool { return s.idleLen+n <= s.maxIdle }
