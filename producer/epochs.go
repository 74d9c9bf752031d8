package producer

import (
	"container/list"
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
type sourceEpochs struct {
	mu      sync.RWMutex // held for writes, and by load
	rec     map[ckf.Member]*epochRecord
	idle    list.List // of *epochRecord, least recently idle first
	maxIdle int
	pruned  uint64
}

type epochRecord struct {
	member ckf.Member
	epoch  uint64
	idle   *list.Element // nil while the member holds blocks
}

func newSourceEpochs(maxIdle int) *sourceEpochs {
	return &sourceEpochs{rec: make(map[ckf.Member]*epochRecord), maxIdle: maxIdle}
}

// get returns m's epoch; ok is false when m has no record.
func (s *sourceEpochs) get(m ckf.Member) (epoch uint64, ok bool) {
	if r := s.rec[m]; r != nil {
		return r.epoch, true
	}
	return 0, false
}

// load is get for goroutines other than the actor's.
func (s *sourceEpochs) load(m ckf.Member) (epoch uint64, ok bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.get(m)
}

// set records epoch for m. A new record is not idle until [settle] says so.
func (s *sourceEpochs) set(m ckf.Member, epoch uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.rec[m]; r != nil {
		r.epoch = epoch
		return
	}
	s.rec[m] = &epochRecord{member: m, epoch: epoch}
}

// forget removes m's record (one set by an event that then faulted).
func (s *sourceEpochs) forget(m ckf.Member) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.rec[m]; r != nil {
		if r.idle != nil {
			s.idle.Remove(r.idle)
		}
		delete(s.rec, m)
	}
}

// settle updates m's record after a command changed what m holds: a member
// holding blocks is never pruned; one holding nothing becomes the most
// recently idle, and the least recently idle records beyond maxIdle go.
func (s *sourceEpochs) settle(m ckf.Member, holds bool) {
	// The actor is the only writer, so it reads without the lock; the
	// common case — a member that holds blocks and is not idle — changes
	// nothing and takes no lock.
	r := s.rec[m]
	if r == nil || (holds && r.idle == nil) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if holds {
		if r.idle != nil {
			s.idle.Remove(r.idle)
			r.idle = nil
		}
		return
	}
	if r.idle != nil {
		s.idle.MoveToBack(r.idle)
		return
	}
	r.idle = s.idle.PushBack(r)
	for s.idle.Len() > s.maxIdle {
		old := s.idle.Remove(s.idle.Front()).(*epochRecord)
		delete(s.rec, old.member)
		s.pruned++
	}
}

// noPruneWithin reports whether n more settles cannot prune a record: each
// adds at most one idle record. Actor goroutine only.
func (s *sourceEpochs) noPruneWithin(n int) bool { return s.idle.Len()+n <= s.maxIdle }
