package producer

import (
	"errors"
	"sync"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// Subscription is one consumer lease's view of a pool: a barrier snapshot
// and the stream of deltas that continues it, starting exactly at
// Snapshot.Sequence → Snapshot.Sequence+1 and gapless until the stream ends.
//
// Deltas is closed when the stream ends; Err then says why: [ErrSuperseded]
// (a later Subscribe took the pool), [ErrLagged] (the bounded buffer
// overflowed — resubscribe with a new lease), [ErrShuttingDown] (a graceful
// end; DrainMarker gives the exact terminal sequence) or [ErrFenced] (the
// unpublished tail was discarded). Deltas already buffered before the end
// are still delivered; a lagged stream holds only deltas that precede the
// gap.
//
// A Subscription may be read from one goroutine while Err is called from
// another. Deltas' Images are shared with no one: the receiver owns them.
type Subscription struct {
	// Snapshot is the table at Snapshot.Sequence under Snapshot.Lease.
	Snapshot ckf.Snapshot
	s        *stream
}

// Deltas returns the delta stream.
func (s *Subscription) Deltas() <-chan ckf.Delta { return s.s.ch }

// Err returns why the stream ended, or nil while it is open.
func (s *Subscription) Err() error {
	s.s.mu.Lock()
	defer s.s.mu.Unlock()
	return s.s.err
}

// DrainMarker returns the exact terminal point of a stream that ended with a
// graceful shutdown; ok is false otherwise.
func (s *Subscription) DrainMarker() (m ckf.DrainMarker, ok bool) {
	s.s.mu.Lock()
	defer s.s.mu.Unlock()
	return s.s.marker, s.s.hasMarker
}

// stream is a subscriber's bounded buffer. Only the actor sends and closes.
type stream struct {
	ch chan ckf.Delta

	mu        sync.Mutex
	err       error
	marker    ckf.DrainMarker
	hasMarker bool
}

func newStream(buffer int) *stream { return &stream{ch: make(chan ckf.Delta, buffer)} }

// end records why the stream ended, then closes it, so a reader that sees
// the close also sees the reason.
func (s *stream) end(err error, marker *ckf.DrainMarker) {
	s.mu.Lock()
	s.err = err
	if marker != nil {
		s.marker, s.hasMarker = *marker, true
	}
	s.mu.Unlock()
	close(s.ch)
}

// streamSink is the actor's [Sink]: it hands each delta to the current
// subscriber without blocking. A full buffer ends the stream with ErrLagged
// and fails the enqueue, so the publisher fences instead of skipping.
//
// While holding (the actor running Apply commands of several events), the
// sink keeps the deltas back and hands them over together: when
// heldDeltas are held, and when the actor stops holding (at the end of
// its wake-up, before any other command and before it waits on the fault
// channel). A parked
// subscriber is woken once per hand-over instead of once per delta
// (docs/RATIONALE.md "Why does the actor hand deltas over in groups?"). A
// held delta counts against the subscriber's buffer exactly as if it were
// in the channel, so the stream lags at the same count of undelivered
// deltas, and the held ones always fit in the channel: each was held only
// with room for it and for every one before it, and only the subscriber
// takes from the channel.
type streamSink struct {
	cur     *stream
	held    []ckf.Delta // accepted, not yet in cur's channel, in order
	maxHeld int         // heldDeltas of the configured buffer
	holding bool
	handed  int // deltas handed over since the actor last parked or yielded
}

// maxHeldDeltas bounds the deltas the sink holds (heldDeltas): 256 is
// 4,096 events at the relay's cadence of 16, ≈ 1–2.5 ms of apply, which a
// subscriber may wait beyond the moment a delta is cut — and only while the
// actor is backlogged, when admitted commands already wait longer than
// that in the mailbox.
const maxHeldDeltas = 256

// heldDeltas is how many deltas the sink holds for a subscriber buffer of
// buffer deltas: a quarter of it, so a subscriber that keeps up never
// lags for what the actor held, and at most maxHeldDeltas.
func heldDeltas(buffer int) int { return min(maxHeldDeltas, max(1, buffer/4)) }

var errNoStream = errors.New("producer: no subscriber stream")

func (k *streamSink) Enqueue(d ckf.Delta) error {
	if k.cur == nil {
		return errNoStream
	}
	if len(k.cur.ch)+len(k.held) >= cap(k.cur.ch) {
		k.handOver() // the deltas before d still reach the subscriber
		k.cur.end(ErrLagged, nil)
		k.cur = nil
		return ErrLagged
	}
	k.held = append(k.held, d)
	if !k.holding || len(k.held) >= k.maxHeld {
		k.handOver()
	}
	return nil
}

// hold starts holding the deltas back.
func (k *streamSink) hold() { k.holding = true }

// release stops holding and hands over what is held.
func (k *streamSink) release() {
	k.holding = false
	k.handOver()
}

// handOver sends the held deltas to the subscriber, in order. No send
// blocks: the room for each was reserved when it was held.
func (k *streamSink) handOver() {
	if len(k.held) == 0 {
		return
	}
	for _, d := range k.held {
		k.cur.ch <- d
	}
	k.handed += len(k.held)
	clear(k.held) // drop the images
	k.held = k.held[:0]
}

// endCurrent ends the current stream, if any, after handing over what it
// holds.
func (k *streamSink) endCurrent(err error, marker *ckf.DrainMarker) {
	if k.cur != nil {
		k.handOver()
		k.cur.end(err, marker)
		k.cur = nil
	}
}
