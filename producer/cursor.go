package producer

import (
	"context"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// Cursor says how far one source's stream was admitted: an engine rank's
// ZMQ sequence, a Dynamo envelope sequence. Source names the stream (the
// source decides the name; it must be stable across relays of a group).
// The actor does not interpret it: it hands it to a [CursorJournal] after
// the events it came with, so a replicated journal carries, at every record
// boundary, how far each source was admitted, and a new leader's sources
// resume after it (issue #34).
type Cursor struct {
	Source string
	Seq    uint64
}

// CursorJournal is a [Journal] that also receives the cursors of
// admissions ([Handle.AdmitEventsAt]), each after the admission's events,
// in order. A cursor changes no exact state; whether it counts in
// [Journal.Position] is the journal's choice (a replicated journal counts
// it, as its replicas do). Cursor runs on the actor goroutine under the
// same rules as the Journal's methods.
type CursorJournal interface {
	Journal
	Cursor(c Cursor)
}

// AdmitEventsAt is [Handle.AdmitEvents] for a source that tracks its
// stream: after evs, the actor hands cur to the journal if it is a
// [CursorJournal]. The cursor is journalled whatever the events' verdicts
// (stale, faulted, applied): it says the source's stream up to cur.Seq was
// admitted, not what the pool made of it. evs may be empty (a batch whose
// events the source dropped): the cursor still moves.
func (h Handle) AdmitEventsAt(ctx context.Context, sourceEpoch uint64, evs []ckf.RouterEvent, cur Cursor) error {
	return h.admit(ctx, sourceEpoch, evs, &cur)
}

// journalCursor hands an Apply command's cursor to the journal. It returns
// true (a cursor never stops the actor).
func (a *actor) journalCursor(c *command) bool {
	if c.cursor != nil {
		if j, ok := a.cfg.Journal.(CursorJournal); ok {
			j.Cursor(*c.cursor)
		}
	}
	return true
}
