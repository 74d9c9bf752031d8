package hub

import (
	"context"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// Subscription is one remote subscriber's stream of deltas after its snapshot.
// It is read by one goroutine.
type Subscription struct {
	hub    *Hub
	lease  ckf.LaneLease
	deltas chan *ckf.Delta // shared with every subscriber: never modified
	done   chan struct{}   // closed when the subscription ends; err is set before
	err    error
}

// Lease returns the subscriber's lease.
func (s *Subscription) Lease() ckf.LaneLease { return s.lease }

// Deltas returns the queue of deltas, in sequence order. They are the hub's
// shared copies, not yet under this subscriber's lease: pass each to
// [Subscription.Stamp], and never modify them. Read it together with
// [Subscription.Done], or use [Subscription.Next].
func (s *Subscription) Deltas() <-chan *ckf.Delta { return s.deltas }

// Stamp returns a copy of d under the subscriber's lease. The copy shares
// d.Images, which must not be modified.
func (s *Subscription) Stamp(d *ckf.Delta) ckf.Delta {
	out := *d
	out.Lease = s.lease
	return out
}

// Done is closed when the subscription ends; [Subscription.Err] then says why.
// Deltas queued before the end are still valid, but after ErrLagged the queue
// has a gap at its end and must not be extended, and after ErrSuperseded the
// lease is fenced: nobody waits for more frames under it.
func (s *Subscription) Done() <-chan struct{} { return s.done }

// Err returns why the subscription ended, or nil while it is live:
//   - [ErrLagged]: its queue overflowed;
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

// Next returns the next delta under the subscriber's lease. After the
// subscription ends it returns the deltas still queued, then the end cause —
// except after ErrLagged, whose queue can no longer be extended, and
// ErrSuperseded, whose lease is fenced: Next reports those at once.
func (s *Subscription) Next(ctx context.Context) (ckf.Delta, error) {
	for {
		select {
		case <-s.done:
			if s.err == ErrLagged || s.err == ErrSuperseded {
				return ckf.Delta{}, s.err
			}
			select {
			case d := <-s.deltas:
				return s.Stamp(d), nil
			default:
				return ckf.Delta{}, s.err
			}
		default:
		}
		select {
		case d := <-s.deltas:
			return s.Stamp(d), nil
		case <-s.done:
		case <-ctx.Done():
			return ckf.Delta{}, ctx.Err()
		}
	}
}

// Cancel ends the subscription (the subscriber went away) and frees its slot.
func (s *Subscription) Cancel() {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	s.hub.endLocked(s, context.Canceled)
}
