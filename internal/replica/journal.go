// Package replica makes a pool's relay one of a group of hot standbys on
// NATS JetStream (issue #34): the leader appends what its actor admits —
// events, rank replacements, resets, in admission order, batched — to a
// replicated stream, one subject per pool, in a compact binary record
// (record.go); standbys apply the same records to their own pool, so their
// exact state and filter words equal the leader's at every record boundary.
// Leadership is a lease on a JetStream KV key (lease.go) and every append is
// fenced by the stream sequence it expects (log.go); docs/RATIONALE.md ("Why
// can two relays never both lead a pool?") has the argument.
//
// The package sits beside the HTTP and gRPC servers and depends only on the
// producer's [producer.Journal] hook and handle, not on either server.
package replica

import (
	"sync"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/producer"
)

// Recorder is a replicated pool's [producer.Journal]. On the leader
// (recording) it queues every command the actor journals for the appender,
// which takes them in batches ([Recorder.Take]): everything admitted during
// one append's round trip goes into the next append. On a standby (not
// recording) it only counts, so the standby's journal position follows the
// leader's record by record.
//
// The actor only appends to a slice under a mutex; it blocks (back-pressure)
// only while maxPending commands wait for the appender.
type Recorder struct {
	mu         sync.Mutex
	cond       *sync.Cond // pending shrank or closed
	recording  bool
	closed     bool
	pending    []Command
	position   uint64 // commands journalled so far
	maxPending int
	ready      chan struct{} // buffered 1: pending became non-empty
}

// NewRecorder returns a recorder that is not recording (a standby's), which
// blocks the actor while maxPending (> 0) commands wait for the appender.
func NewRecorder(maxPending int) *Recorder {
	r := &Recorder{maxPending: max(1, maxPending), ready: make(chan struct{}, 1)}
	r.cond = sync.NewCond(&r.mu)
	return r
}

// Admitted implements [producer.Journal].
func (r *Recorder) Admitted(sourceEpoch uint64, ev *ckf.RouterEvent) {
	r.add(Command{Kind: KindAdmitted, SourceEpoch: sourceEpoch, Event: *ev})
}

// Replaced implements [producer.Journal].
func (r *Recorder) Replaced(reps []producer.RankReplacement) {
	r.add(Command{Kind: KindReplaced, Reps: reps})
}

// Reset implements [producer.Journal].
func (r *Recorder) Reset(sourceEpoch uint64, m ckf.Member, degraded bool) {
	r.add(Command{Kind: KindReset, SourceEpoch: sourceEpoch, Member: m, Degraded: degraded})
}

// setPosition starts the count at pos: a pool started from a checkpoint's
// image has journalled pos commands (before its actor journals any).
func (r *Recorder) setPosition(pos uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.position = pos
}

// Cursor implements [producer.CursorJournal]. A cursor counts in the
// position (the standby's actor journals it too, [Apply]), so every batch
// starts at a distinct position and its message ids stay distinct.
func (r *Recorder) Cursor(c producer.Cursor) {
	r.add(Command{Kind: KindCursor, Cursor: c})
}

// Position implements [producer.Journal].
func (r *Recorder) Position() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.position
}

func (r *Recorder) add(c Command) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.position++
	if !r.recording {
		return
	}
	for len(r.pending) >= r.maxPending && !r.closed {
		r.cond.Wait()
	}
	if r.closed {
		return
	}
	r.pending = append(r.pending, c)
	select {
	case r.ready <- struct{}{}:
	default:
	}
}

// SetRecording switches queueing on (the leader, after its term record is
// appended) or off (a standby: what was pending is dropped — a deposed
// leader's unappended commands are exactly what it must forget).
func (r *Recorder) SetRecording(on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recording = on
	if !on {
		r.pending = nil
		r.cond.Broadcast()
	}
}

// Ready receives after commands were queued; [Recorder.Take] them.
func (r *Recorder) Ready() <-chan struct{} { return r.ready }

// Take returns the queued commands and the journal position before the
// first of them, and empties the queue.
func (r *Recorder) Take() (position uint64, cmds []Command) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cmds, r.pending = r.pending, nil
	r.cond.Broadcast()
	return r.position - uint64(len(cmds)), cmds
}

// Close releases an actor blocked on a full queue (its commands are
// dropped: the pool is being discarded).
func (r *Recorder) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	r.cond.Broadcast()
}
