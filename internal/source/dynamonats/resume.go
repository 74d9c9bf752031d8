package dynamonats

import (
	"strconv"
	"strings"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/source"
	"github.com/ckfrelay/ckfrelay/producer"
)

// The cursors of a replicated pool's records (issue #34): every admission
// names the member, its publisher and the envelope sequence it came from,
// so a new leader's source takes each member up where the group's records
// end instead of meeting it as a first contact — which reset the member
// and dropped every block it held (the red team's F12: a takeover wiped a
// Dynamo worker's cache), and took the messages JetStream redelivers after
// the deposed leader's naks for gaps and duplicates.

const cursorPrefix = "dynamo/"

// cursorSource names member m's stream from publisher in a cursor.
func cursorSource(m ckf.Member, publisher uint64) string {
	return cursorPrefix + strconv.FormatUint(m.WorkerID, 10) + "/" + strconv.FormatUint(uint64(m.DPRank), 10) + "/" +
		strconv.FormatUint(publisher, 10)
}

// publisherState is one publisher's envelope sequence and the members it
// carries.
type publisherState struct {
	next    uint64 // next expected envelope sequence
	members map[ckf.Member]struct{}
}

// resumePoint is where a group's records end for this source.
type resumePoint struct {
	next   map[uint64]uint64     // by publisher, the next envelope sequence
	member map[ckf.Member]uint64 // by member, the publisher it was last admitted from
}

// Resume makes the next Run take up each publisher that cursors name after
// the last envelope sequence the records hold from it, and its members
// under the epochs the pool records for them: a redelivered message the
// records hold is dropped as seen, the next is admitted, one past a hole
// is a gap (a degraded reset of the publisher's members), as in a running
// source. Cursors of other sources are ignored. Call it before Run.
func (s *Source) Resume(cursors []producer.Cursor) {
	s.resume = resumePoint{next: map[uint64]uint64{}, member: map[ckf.Member]uint64{}}
	for _, c := range cursors {
		rest, ok := strings.CutPrefix(c.Source, cursorPrefix)
		if !ok {
			continue
		}
		f := strings.Split(rest, "/")
		if len(f) != 3 {
			continue
		}
		w, err1 := strconv.ParseUint(f[0], 10, 64)
		dp, err2 := strconv.ParseUint(f[1], 10, 32)
		pub, err3 := strconv.ParseUint(f[2], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			continue
		}
		s.resume.member[ckf.Member{WorkerID: w, DPRank: uint32(dp)}] = pub
		// The publisher's members' cursors hold its sequences; the
		// latest, modulo 2^64, is where the records end.
		if next, ok := s.resume.next[pub]; !ok || c.Seq+1-next < 1<<63 {
			s.resume.next[pub] = c.Seq + 1
		}
	}
}

// resumed enters publisher from the cursors Resume named — its next
// sequence, and its members the pool holds an epoch for — or returns nil.
func (s *Source) resumed(sink source.Sink, publisher uint64, now time.Time) *publisherState {
	next, ok := s.resume.next[publisher]
	if !ok {
		return nil
	}
	delete(s.resume.next, publisher)
	ps := &publisherState{next: next, members: map[ckf.Member]struct{}{}}
	s.publishers[publisher] = ps
	for m, pub := range s.resume.member {
		if pub != publisher {
			continue
		}
		delete(s.resume.member, m)
		epoch, known := source.RecordedEpoch(sink, m)
		if !known || s.members[m] != nil {
			continue
		}
		s.members[m] = &memberState{publisher: publisher, epoch: epoch, seen: now}
		ps.members[m] = struct{}{}
	}
	return ps
}
