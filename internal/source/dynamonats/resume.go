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

// Resume makes the next Run take up each member that cursors name after
// the cursor's envelope sequence, under the epoch the pool records for it,
// provided its first message comes from the same publisher: a redelivered
// message the records hold is dropped as seen, the next one is admitted,
// one past a hole is a gap (a degraded reset), as in a running source.
// Cursors of other sources are ignored. Call it before Run.
func (s *Source) Resume(cursors []producer.Cursor) {
	s.resume = map[resumeKey]uint64{}
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
		s.resume[resumeKey{ckf.Member{WorkerID: w, DPRank: uint32(dp)}, pub}] = c.Seq + 1
	}
}

// resumed enters member m from the cursors Resume named, when env comes
// from the publisher its cursor names and the pool holds an epoch for it.
func (s *Source) resumed(sink source.Sink, m ckf.Member, env Envelope, now time.Time) bool {
	k := resumeKey{m, env.PublisherID}
	next, ok := s.resume[k]
	if !ok {
		return false
	}
	delete(s.resume, k)
	epoch, known := source.RecordedEpoch(sink, m)
	if !known {
		return false
	}
	s.members[m] = &memberState{publisher: env.PublisherID, epoch: epoch, next: next, seen: now}
	return true
}
