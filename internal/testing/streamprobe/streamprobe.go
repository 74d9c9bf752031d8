// Package streamprobe follows one pool stream of a relay with a native
// consumer and times how long probed blocks take to become visible in it:
// the freshness measure of the relay's benchmarks (internal/server) and of
// its soak test (cmd/relay), written once.
//
// A Reader applies every frame to its consumer, in lane 0, assigning the
// lease the stream's first snapshot chunk carries. A probe names a block's
// sequence hash and when its event was sent; the reader records the time
// from then until the first frame after which the consumer holds the block.
// One probe is pending at a time, so a measurement never waits behind
// another.
package streamprobe

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wire"
)

// ErrClosed is returned by [Reader.Run] when the relay ends the stream with
// a close frame.
var ErrClosed = errors.New("streamprobe: the relay closed the stream")

// Reader applies a stream to a consumer and measures freshness. Its methods
// are safe for concurrent use with Run.
type Reader struct {
	mu      sync.Mutex // guards c, fresh and pending
	c       *consumer.Consumer
	fresh   []time.Duration
	pending *probe // taken from probes, not yet visible
	probes  chan probe
	ready   chan struct{}
	once    sync.Once
}

type probe struct {
	key uint64
	t0  time.Time
}

// New returns a Reader applying frames to c.
func New(c *consumer.Consumer) *Reader {
	return &Reader{c: c, probes: make(chan probe, 1), ready: make(chan struct{})}
}

// Run reads frames from r until it fails, applying each. It returns r's
// error (io.EOF when the stream ended cleanly), an assignment error, or
// [ErrClosed] naming the close frame the relay ended the stream with.
func (p *Reader) Run(r io.Reader) error {
	defer p.markReady() // a waiter must not hang on a stream that failed early
	fr := wire.NewReader(r, 0)
	var f wire.Frame
	first := true
	for {
		if err := fr.ReadFrame(&f); err != nil {
			return err
		}
		p.mu.Lock()
		if first {
			if err := p.c.Assign(f.Snapshot.Identity, f.Snapshot.Lease); err != nil {
				p.mu.Unlock()
				return fmt.Errorf("streamprobe: assign the stream's lease: %w", err)
			}
			first = false
		}
		res := p.c.ApplyFrame(&f)
		if p.pending == nil {
			select {
			case pr := <-p.probes:
				p.pending = &pr
			default:
			}
		}
		if p.pending != nil {
			if mask, _ := p.c.Contains(p.pending.key); mask&1 != 0 {
				p.fresh = append(p.fresh, time.Since(p.pending.t0))
				p.pending = nil
			}
		}
		p.mu.Unlock()
		if res.Outcome == consumer.SnapshotInstalled {
			p.markReady()
		}
		if f.Kind == wire.KindClose {
			return fmt.Errorf("%w: %+v", ErrClosed, f.Close)
		}
	}
}

func (p *Reader) markReady() { p.once.Do(func() { close(p.ready) }) }

// Ready is closed once the stream's snapshot is installed (or Run returned).
func (p *Reader) Ready() <-chan struct{} { return p.ready }

// Probe asks to time the arrival of the block with sequence hash key, whose
// event was sent at t0. It reports false, and measures nothing, while an
// earlier probe is still pending.
func (p *Reader) Probe(key uint64, t0 time.Time) bool {
	select {
	case p.probes <- probe{key: key, t0: t0}:
		return true
	default:
		return false
	}
}

// Visible reports whether the consumer holds key now.
func (p *Reader) Visible(key uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	mask, _ := p.c.Contains(key)
	return mask&1 != 0
}

// Idle reports whether no probe waits to be measured.
func (p *Reader) Idle() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pending == nil && len(p.probes) == 0
}

// Measured returns how many probes have been measured.
func (p *Reader) Measured() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.fresh)
}

// Freshness returns the measured times, sorted, with their median and 99th
// percentile (zero without samples).
func (p *Reader) Freshness() (sorted []time.Duration, p50, p99 time.Duration) {
	p.mu.Lock()
	s := slices.Clone(p.fresh)
	p.mu.Unlock()
	if len(s) == 0 {
		return nil, 0, 0
	}
	slices.Sort(s)
	return s, s[len(s)/2], s[min(len(s)-1, len(s)*99/100)]
}
