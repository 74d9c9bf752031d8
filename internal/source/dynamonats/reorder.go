package dynamonats

import "time"

// The reorder window (issue #34; the red team's F12 after a SIGSTOP). A
// JetStream consumer gets a message again when its acknowledgement timed
// out (AckWait) or it was naked — after newer messages of the same
// publisher already reached this consumer: a relay leader frozen while it
// held messages, then deposed, hands them to the next leader's source
// AckWait later, behind everything published since. Taken in arrival
// order, the first newer message was a gap (a degraded reset that dropped
// the member's blocks) and the older ones came as duplicates (dropped):
// 359–414 acknowledged events lost per takeover in the red team's runs.
//
// So on JetStream a message ahead of a hole in its publisher's sequence is
// held, unacknowledged (kept in progress), until the hole fills — each
// message admitted admits the held one that is next after it — or until
// the hole has stayed open for Config.GapWait, past the redelivery of
// anything another consumer held. Only then is the hole a gap: the member
// is reset degraded and the held messages follow in order. Core NATS never
// redelivers, so there a hole is a gap at once, as before.

// holdKey names a message by its publisher's sequence.
type holdKey struct{ publisher, seq uint64 }

// heldMsg is a message ahead of a hole in its publisher's sequence.
type heldMsg struct {
	key       holdKey
	streamSeq uint64 // its JetStream stream sequence
	data      []byte
	// settles are the deliveries of this message (a redelivery while held
	// is the same message again): all are settled together.
	settles []func(settlement)
	// deadline is when the hole counts as a gap; touched when the server
	// was last told the message is in progress.
	deadline, touched time.Time
}

// holdBuffer keeps the held messages of one Run, bounded in count and bytes.
type holdBuffer struct {
	msgs     map[holdKey]*heldMsg
	bytes    int
	maxMsgs  int
	maxBytes int
}

// Bounds of the hold buffer: a message past them forces the youngest hole
// to a gap. maxHeldMessages leaves most of the consumer's MaxAckPending
// (held messages are pending) to the publishers without a hole; 32 MiB
// bounds the memory holes may pin.
const (
	maxHeldMessages = maxAckPending / 2
	maxHeldBytes    = 32 << 20
)

func newHoldBuffer(maxMsgs, maxBytes int) *holdBuffer {
	return &holdBuffer{msgs: map[holdKey]*heldMsg{}, maxMsgs: maxMsgs, maxBytes: maxBytes}
}

// add holds a message, or records a redelivery (the same stream sequence)
// of one held. It returns false, holding nothing, for another message
// under a held key: a second publication of the same envelope sequence.
func (h *holdBuffer) add(k holdKey, data []byte, settles []func(settlement), streamSeq uint64, now time.Time, wait time.Duration) bool {
	if hm := h.msgs[k]; hm != nil {
		if hm.streamSeq != streamSeq {
			return false
		}
		hm.settles = append(hm.settles, settles...)
		return true
	}
	h.msgs[k] = &heldMsg{key: k, streamSeq: streamSeq, data: data, settles: settles, deadline: now.Add(wait), touched: now}
	h.bytes += len(data)
	return true
}

// take removes and returns the message held under k, if any.
func (h *holdBuffer) take(k holdKey) *heldMsg {
	hm := h.msgs[k]
	if hm != nil {
		delete(h.msgs, k)
		h.bytes -= len(hm.data)
	}
	return hm
}

func (h *holdBuffer) len() int { return len(h.msgs) }

// over reports whether the buffer holds more than its bounds allow.
func (h *holdBuffer) over() bool { return len(h.msgs) > h.maxMsgs || h.bytes > h.maxBytes }

// earliest returns the message with the earliest deadline: the first
// held message of the oldest hole (nil when empty).
func (h *holdBuffer) earliest() *heldMsg {
	var first *heldMsg
	for _, hm := range h.msgs {
		if first == nil || hm.deadline.Before(first.deadline) {
			first = hm
		}
	}
	return first
}

// expired returns the earliest message when its deadline is not after
// now, else nil.
func (h *holdBuffer) expired(now time.Time) *heldMsg {
	if first := h.earliest(); first != nil && !first.deadline.After(now) {
		return first
	}
	return nil
}

// youngest returns a held message of the publisher whose hole opened last
// (its first held message arrived after every other publisher's), nil when
// empty.
func (h *holdBuffer) youngest() *heldMsg {
	first := map[uint64]*heldMsg{} // by publisher, its earliest held message
	for _, hm := range h.msgs {
		if f := first[hm.key.publisher]; f == nil || hm.deadline.Before(f.deadline) {
			first[hm.key.publisher] = hm
		}
	}
	var young *heldMsg
	for _, f := range first {
		if young == nil || f.deadline.After(young.deadline) {
			young = f
		}
	}
	return young
}

// opened returns when the oldest hole opened: its first held message's
// arrival (deadline − wait).
func (h *holdBuffer) opened(wait time.Duration) (time.Time, bool) {
	first := h.earliest()
	if first == nil {
		return time.Time{}, false
	}
	return first.deadline.Add(-wait), true
}

// lowest returns the held message of publisher that is the least ahead of
// next: where a forced gap starts, so that no held message of the
// publisher falls behind it.
func (h *holdBuffer) lowest(publisher uint64, next uint64) *heldMsg {
	var low *heldMsg
	for _, hm := range h.msgs {
		if hm.key.publisher != publisher {
			continue
		}
		if low == nil || hm.key.seq-next < low.key.seq-next {
			low = hm
		}
	}
	return low
}

// stale returns the messages not told in progress since before cutoff, and
// marks them told at now.
func (h *holdBuffer) stale(cutoff, now time.Time) []*heldMsg {
	var out []*heldMsg
	for _, hm := range h.msgs {
		if hm.touched.Before(cutoff) {
			hm.touched = now
			out = append(out, hm)
		}
	}
	return out
}

// drain removes and returns every held message.
func (h *holdBuffer) drain() []*heldMsg {
	out := make([]*heldMsg, 0, len(h.msgs))
	for k, hm := range h.msgs {
		out = append(out, hm)
		delete(h.msgs, k)
	}
	h.bytes = 0
	return out
}

// aheadOf reports whether env is ahead of its publisher's next sequence by
// a hole of at most maxAckPending messages, the most a redelivery can fill.
// Farther ahead (or behind) is no hole a redelivery fills, and order's
// rules apply at once.
func (s *Source) aheadOf(env Envelope) bool {
	if !env.Enveloped {
		return false
	}
	next, ok := s.expectedNext(env.PublisherID)
	ahead := env.Sequence - next
	return ok && ahead > 0 && ahead <= maxAckPending
}

// expectedNext returns the sequence publisher's next envelope should carry:
// the running publisher's, or the one Resume named for it.
func (s *Source) expectedNext(publisher uint64) (uint64, bool) {
	if ps := s.publishers[publisher]; ps != nil {
		return ps.next, true
	}
	next, ok := s.resume.next[publisher]
	return next, ok
}
