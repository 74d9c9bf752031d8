package zmq

import (
	"log/slog"
	"strconv"
	"strings"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/source"
	"github.com/ckfrelay/ckfrelay/producer"
)

// cursorSource names rank dp's stream in the cursors the source admits
// with ([source.CursorSink]): the source's worker id and the rank, which
// every relay of a group configures alike.
func (s *Source) cursorSource(dp uint32) string {
	return "zmq/" + strconv.FormatUint(s.cfg.Worker, 10) + "/" + strconv.FormatUint(uint64(dp), 10)
}

// Resume makes the next Run take up each rank that cursors name (its
// [producer.Cursor]s, as a replicated pool's records carry them, issue #34)
// after the cursor's sequence: a new leader's pool holds the rank's stream
// up to that sequence, so the rank starts synced there, under the epoch the
// pool records, and its first message — a later sequence, since the engine
// kept publishing — is a gap the engine's replay socket fills from the
// cursor's sequence + 1: nothing admitted twice, nothing skipped. What the
// replay cannot cover resets the rank (degraded), as any gap does. Cursors
// of other sources, of ranks beyond the source's, or of members the pool
// holds no epoch for are ignored (those ranks start as on first contact).
// Call it before Run.
func (s *Source) Resume(cursors []producer.Cursor) {
	prefix := "zmq/" + strconv.FormatUint(s.cfg.Worker, 10) + "/"
	s.resume = map[uint32]int64{}
	for _, c := range cursors {
		rest, ok := strings.CutPrefix(c.Source, prefix)
		if !ok {
			continue
		}
		dp, err := strconv.ParseUint(rest, 10, 32)
		if err != nil || dp >= uint64(s.maxRanks) || c.Seq > 1<<63-2 {
			continue
		}
		s.resume[uint32(dp)] = int64(c.Seq)
	}
}

// resumeRanks enters the ranks Resume named (Run's goroutine).
func (s *Source) resumeRanks(sink source.Sink) {
	for dp, seq := range s.resume {
		m := ckf.Member{WorkerID: s.cfg.Worker, DPRank: dp}
		epoch, ok := source.RecordedEpoch(sink, m)
		if !ok || s.ranks[dp] != nil {
			continue
		}
		r := &rank{member: m, state: RankLive, epoch: epoch, synced: true, next: seq + 1}
		// No batch of the stream is held here: nothing may pass for one
		// (a zero entry would claim sequence 0).
		for i := range r.recent {
			r.recent[i].seq = -1
		}
		if s.cfg.Replay != "" {
			r.replayEP, _ = RankEndpoint(s.cfg.Replay, int(dp))
		}
		s.addRank(r)
		s.publishRank(r)
		s.logs.log(s.log, slog.LevelInfo, "zmq source: rank resumed after its cursor", "rank", dp, "after", seq, "epoch", epoch)
	}
	s.resume = nil
}
