package grpcserver

import (
	"context"
	"errors"
	"sync"
)

// errFeedLagged: a subscriber asked for a value the feed no longer holds.
// errFeedClosed: the feed stopped (shutdown).
var (
	errFeedLagged = errors.New("feed: subscriber lagged")
	errFeedClosed = errors.New("feed: closed")
)

// feed is a bounded broadcast of complete values (catalog revisions, load
// windows): it keeps the last len(ring) values, numbered from 1. One
// goroutine publishes; any number read.
type feed[T any] struct {
	mu     sync.Mutex
	ring   []T
	seq    uint64 // the number of the newest value; 0 before the first
	wake   chan struct{}
	closed bool
}

func newFeed[T any](history int) *feed[T] {
	return &feed[T]{ring: make([]T, history), wake: make(chan struct{})}
}

func (f *feed[T]) publish(v T) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	f.ring[f.seq%uint64(len(f.ring))] = v
	close(f.wake)
	f.wake = make(chan struct{})
}

func (f *feed[T]) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.closed {
		f.closed = true
		close(f.wake)
	}
}

// latest returns the newest value and its number (0 before the first).
func (f *feed[T]) latest() (T, uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ring[f.seq%uint64(len(f.ring))], f.seq
}

// next waits for a value newer than after. With coalesce it returns the
// newest (values in between are skipped); otherwise the one right after,
// or errFeedLagged when that one is gone. errFeedClosed after close; ctx's
// error when ctx ends.
func (f *feed[T]) next(ctx context.Context, after uint64, coalesce bool) (T, uint64, error) {
	var zero T
	for {
		f.mu.Lock()
		switch {
		case f.closed:
			f.mu.Unlock()
			return zero, 0, errFeedClosed
		case f.seq > after && coalesce:
			v, s := f.ring[f.seq%uint64(len(f.ring))], f.seq
			f.mu.Unlock()
			return v, s, nil
		case f.seq > after:
			want := after + 1
			if f.seq-want >= uint64(len(f.ring)) {
				f.mu.Unlock()
				return zero, 0, errFeedLagged
			}
			v := f.ring[want%uint64(len(f.ring))]
			f.mu.Unlock()
			return v, want, nil
		}
		wake := f.wake
		f.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return zero, 0, ctx.Err()
		}
	}
}
