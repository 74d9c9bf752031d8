package hub

import (
	"context"
	"errors"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// errCanceled is the cause of [Subscription.Cancel].
var errCanceled = context.Canceled

// ErrSnapshotRead: [Subscription.ReadSnapshot] was called after the snapshot
// was read to its end (or the subscriber moved on to its deltas).
var ErrSnapshotRead = errors.New("hub: snapshot already read")

// closedChan is a channel that is always ready.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Subscription is one remote subscriber: a snapshot, read a chunk at a time
// with [Subscription.ReadSnapshot], then the deltas after it, read with
// [Subscription.Poll] or [Subscription.Next]. It is read by one goroutine.
type Subscription struct {
	hub    *Hub
	lease  ckf.LaneLease
	client string       // the address it is charged to ([Hub.SubscribeFrom]); "" for none
	snap   ckf.Snapshot // header only: Words is nil

	// Guarded by hub.mu.
	gen  *generation   // the snapshot's generation until it is read or the subscription ends
	at   uint64        // the sequence the subscriber has reached
	tail []*ckf.Delta  // after the end: the deltas still readable
	done chan struct{} // closed when the subscription ends; err is set before
	err  error
}

// Lease returns the subscriber's lease.
func (s *Subscription) Lease() ckf.LaneLease { return s.lease }

// Snapshot returns the snapshot's identity, lease and sequence, with no
// words: read those with [Subscription.ReadSnapshot]. Its length is
// Identity.Format.BucketCount.
func (s *Subscription) Snapshot() ckf.Snapshot { return s.snap }

// ReadSnapshot copies the snapshot's words from offset into dst and returns
// how many it copied. Copying the last words releases the subscriber's hold
// on the shared generation, so a subscriber that writes what it copied holds
// at most len(dst) words of its snapshot, never the table. Once the
// subscription has ended it returns the end cause (see [Subscription.Err]):
// the rest of the snapshot would be of no use.
func (s *Subscription) ReadSnapshot(offset int, dst []uint64) (int, error) {
	h := s.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	if s.err != nil {
		return 0, s.err
	}
	if s.gen == nil {
		return 0, ErrSnapshotRead
	}
	if offset < 0 || offset > len(s.gen.words) {
		return 0, errors.New("hub: snapshot offset out of range")
	}
	n := copy(dst, s.gen.words[offset:])
	if offset+n == len(s.gen.words) {
		h.releaseLocked(s)
	}
	return n, nil
}

// Poll returns the next delta under the subscriber's lease if there is one
// (ok), else the end cause if the subscription has ended, else nothing. After
// the end it still returns the deltas left unread — except after ErrLagged,
// whose log has a gap, and ErrSuperseded, whose lease is fenced, and a
// cancel. Taking a delta ends the subscriber's hold on its snapshot.
func (s *Subscription) Poll() (d ckf.Delta, ok bool, err error) {
	h := s.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	if s.err != nil {
		if len(s.tail) == 0 {
			return ckf.Delta{}, false, s.err
		}
		next := s.tail[0]
		s.tail = s.tail[1:]
		s.at = next.Sequence
		return s.stamp(next), true, nil
	}
	h.releaseLocked(s)
	if s.at == h.sequence {
		return ckf.Delta{}, false, nil
	}
	next := h.log.get(s.at)
	s.at = next.Sequence
	return s.stamp(next), true, nil
}

// Wait returns a channel that is closed when [Subscription.Poll] may have
// something new: a delta or the end. Call it again after each wake.
func (s *Subscription) Wait() <-chan struct{} {
	h := s.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	if s.err != nil || s.at != h.sequence {
		return closedChan
	}
	return h.wake
}

// stamp returns a copy of d under the subscriber's lease. The copy shares
// d.Images, which must not be modified.
func (s *Subscription) stamp(d *ckf.Delta) ckf.Delta {
	out := *d
	out.Lease = s.lease
	return out
}

// Done is closed when the subscription ends; [Subscription.Err] then says why.
func (s *Subscription) Done() <-chan struct{} { return s.done }

// Err returns why the subscription ended, or nil while it is live:
//   - [ErrLagged]: it fell off the shared log (or its snapshot's generation did);
//   - [ErrSuperseded]: the same (consumer, lane) subscribed under a higher
//     epoch (the relay closes the stream as fenced);
//   - [ErrProducerChanged]: the hub re-installed;
//   - [ErrBrokenStream]: the hub's own stream broke;
//   - [ErrClosed] or the cause given to [Hub.Close]: the hub shut down;
//   - context.Canceled: [Subscription.Cancel].
func (s *Subscription) Err() error {
	select {
	case <-s.done:
		return s.err
	default:
		return nil
	}
}

// Next waits for the next delta under the subscriber's lease (see
// [Subscription.Poll] for what it returns after the end).
func (s *Subscription) Next(ctx context.Context) (ckf.Delta, error) {
	for {
		wake := s.Wait()
		d, ok, err := s.Poll()
		if ok || err != nil {
			return d, err
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return ckf.Delta{}, ctx.Err()
		}
	}
}

// Cancel ends the subscription (the subscriber went away) and frees its slot
// and its hold on the log and its snapshot.
func (s *Subscription) Cancel() {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	s.hub.endLocked(s, errCanceled)
}
