package producer

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
)

// mailbox is the actor's bounded command queue (docs/RATIONALE.md "Why does
// the actor take its whole mailbox at once?"). Senders append under a
// mutex; the actor takes everything queued in one swap of two slices and
// runs it without further synchronisation, so a command costs its sender
// one uncontended lock and its actor nothing but the run: no channel
// receive, no lock handed between the two cores per command.
//
// Back-pressure: at most capacity commands wait in the queue. A sender that
// finds it full waits until the actor next takes the queue; every waiting
// sender wakes then, together (one wake-up per batch, not one per command,
// and no waiter is served ahead of another). The batch the actor has taken
// and not yet run is at most capacity commands too.
type mailbox struct {
	capacity int

	mu     sync.Mutex
	queue  []command     // waiting to be taken, in admission order
	parked bool          // the actor found the queue empty and waits on ready
	space  chan struct{} // closed when the actor takes the queue; nil while no sender waits
	closed bool          // admission stopped: the queue's content is final

	// ready carries one wake-up for a parked actor (buffered 1: a stale
	// token costs the actor one empty take).
	ready chan struct{}
	// unrun counts the commands of the actor's current batch not yet
	// started, for depth. The actor stores it at every command: it has a
	// cache line of its own, so the store does not take the line of the
	// lock and the queue from the core of a sender (64 bytes: a line on
	// amd64 and most arm64).
	_     [64]byte
	unrun atomic.Int64
	_     [56]byte
}

// errMailboxClosed is put's refusal once admission stopped; the actor's
// send turns it into its stop error.
var errMailboxClosed = errors.New("producer: mailbox closed")

func newMailbox(capacity int) *mailbox {
	return &mailbox{capacity: capacity, ready: make(chan struct{}, 1)}
}

// put queues c, waiting while the queue is full, until ctx ends or closing
// is closed (then it returns errMailboxClosed, as it does once the mailbox
// is closed).
func (m *mailbox) put(ctx context.Context, c *command, closing <-chan struct{}) error {
	for {
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			return errMailboxClosed
		}
		if len(m.queue) < m.capacity {
			m.queue = append(m.queue, *c)
			wake := m.parked
			m.parked = false
			m.mu.Unlock()
			if wake {
				select {
				case m.ready <- struct{}{}:
				default: // a token is already there
				}
			}
			return nil
		}
		if m.space == nil {
			m.space = make(chan struct{})
		}
		space := m.space
		m.mu.Unlock()
		select {
		case <-space:
		case <-closing:
			return errMailboxClosed
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// take hands the actor every queued command, in order, and gives the queue
// spare (the actor's previous batch, run and cleared) to fill next. The
// senders waiting for room wake. An empty batch parks the actor until the
// next put signals ready; closed then says that none will come.
func (m *mailbox) take(spare []command) (batch []command, closed bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.queue) == 0 {
		m.parked = !m.closed
		return spare[:0], m.closed
	}
	batch, m.queue = m.queue, spare[:0]
	m.unrun.Store(int64(len(batch)))
	if m.space != nil {
		close(m.space)
		m.space = nil
	}
	return batch, false
}

// close stops admission: later puts fail, and the queue's content is final
// once close returns.
func (m *mailbox) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
}

// depth is the number of commands admitted and not yet started: queued,
// and taken by the actor but not reached (a racy gauge).
func (m *mailbox) depth() int {
	m.mu.Lock()
	n := len(m.queue)
	m.mu.Unlock()
	return n + int(m.unrun.Load())
}
