package producer

import (
	"container/list"
	"sync"

	"github.com/ckfrelay/ckfrelay/ckf"
)

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

// settle updates m's record after a command changed what m holds: a member
// holding blocks is never pruned; one holding nothing becomes the most
// recently idle, and the least recently idle records beyond maxIdle go.
func (s *sourceEpochs) settle(m ckf.Member, holds bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.rec[m]
	if r == nil {
		return
	}
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
