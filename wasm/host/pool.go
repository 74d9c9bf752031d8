package host

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
)

// Pool is several instances of the module configured with one manifest and
// fed the same frames, so queries can run in parallel (one per instance)
// while an [Instance] runs one call at a time. It is worth it when queries
// saturate one core; it multiplies memory (one table per instance) and the
// cost of every frame by the instance count. Pool implements client.Lanes and
// is safe for concurrent use.
//
// Mutations (Assign, Retire, ApplyFrame) are serialized and applied to every
// instance in order; the result is instance 0's. Queries and reads go to an
// idle instance. While a frame is being applied, a query may see it on one
// instance and not yet on another — the same non-atomic visibility a single
// consumer gives a multi-bucket delta (SPEC §8.4). If any instance traps
// during a mutation, every lane of every instance is retired (epochs are
// kept) so the instances agree again, and the call returns an error
// matching [ErrInstanceReset].
type Pool struct {
	mu   sync.Mutex // serializes mutations across instances
	all  []*Instance
	idle chan *Instance
}

// NewPool makes n ≥ 1 instances configured with m.
func (r *Runtime) NewPool(ctx context.Context, m consumer.Manifest, n int) (*Pool, error) {
	if n < 1 {
		return nil, fmt.Errorf("%w: pool of %d instances", ErrInvalidConfig, n)
	}
	p := &Pool{idle: make(chan *Instance, n)}
	for range n {
		in, err := r.NewInstance(ctx, m)
		if err != nil {
			p.Close()
			return nil, err
		}
		p.all = append(p.all, in)
		p.idle <- in
	}
	return p, nil
}

// Close closes every instance.
func (p *Pool) Close() error {
	for _, in := range p.all {
		in.Close()
	}
	return nil
}

// Size returns the number of instances.
func (p *Pool) Size() int { return len(p.all) }

// mutate applies f to every instance and returns instance 0's error.
func (p *Pool) mutate(f func(in *Instance) error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var first error
	reset := false
	for i, in := range p.all {
		err := f(in)
		if i == 0 {
			first = err
		}
		reset = reset || errors.Is(err, ErrInstanceReset)
	}
	if reset {
		for _, in := range p.all {
			for l := range ckf.MaxLanes {
				if in.manifest.Lanes[l] != nil {
					_ = in.Retire(l)
				}
			}
		}
		if !errors.Is(first, ErrInstanceReset) {
			first = fmt.Errorf("%w: another instance of the pool trapped", ErrInstanceReset)
		}
	}
	return first
}

// read runs f on an idle instance.
func (p *Pool) read(f func(in *Instance) error) error {
	in := <-p.idle
	defer func() { p.idle <- in }()
	return f(in)
}

// Assign implements client.Lanes.
func (p *Pool) Assign(identity ckf.ProducerIdentity, lease ckf.LaneLease) error {
	return p.mutate(func(in *Instance) error { return in.Assign(identity, lease) })
}

// Retire implements client.Lanes.
func (p *Pool) Retire(lane int) error {
	return p.mutate(func(in *Instance) error { return in.Retire(lane) })
}

// ApplyFrame implements client.Lanes.
func (p *Pool) ApplyFrame(frame []byte) (consumer.Result, error) {
	var res consumer.Result
	first := true
	err := p.mutate(func(in *Instance) error {
		r, err := in.ApplyFrame(frame)
		if first {
			res, first = r, false
		}
		return err
	})
	return res, err
}

// Query implements client.Lanes.
func (p *Pool) Query(locals []uint64, res *consumer.QueryResult) error {
	return p.read(func(in *Instance) error { return in.Query(locals, res) })
}

// QuerySequenceHashes implements client.Lanes.
func (p *Pool) QuerySequenceHashes(seq []uint64, res *consumer.QueryResult) error {
	return p.read(func(in *Instance) error { return in.QuerySequenceHashes(seq, res) })
}

// QueryTokens implements client.Lanes.
func (p *Pool) QueryTokens(tokens []uint32, blockSize int, salt uint64, res *consumer.QueryResult) error {
	return p.read(func(in *Instance) error { return in.QueryTokens(tokens, blockSize, salt, res) })
}

// QueryTokensWith implements client.Lanes.
func (p *Pool) QueryTokensWith(tokens []uint32, blockSize int, salt uint64, o ckf.HashOptions, res *consumer.QueryResult) error {
	return p.read(func(in *Instance) error { return in.QueryTokensWith(tokens, blockSize, salt, o, res) })
}

// Contains implements client.Lanes.
func (p *Pool) Contains(seqHash uint64) (mask uint16, err error) {
	err = p.read(func(in *Instance) error {
		mask, err = in.Contains(seqHash)
		return err
	})
	return mask, err
}

// LaneStatus implements client.Lanes; frame counters are per instance, so it
// reports instance 0's, under the mutation lock.
func (p *Pool) LaneStatus(lane int) (consumer.LaneStatus, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.all[0].LaneStatus(lane)
}

// AppendLaneWords implements client.Lanes from instance 0.
func (p *Pool) AppendLaneWords(dst []uint64, lane int) ([]uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.all[0].AppendLaneWords(dst, lane)
}

// Stats implements client.Lanes: instance 0's table figures, with the query
// counters summed over every instance.
func (p *Pool) Stats() (consumer.Stats, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var s consumer.Stats
	for i, in := range p.all {
		st, err := in.Stats()
		if err != nil {
			return s, err
		}
		if i == 0 {
			s = st
			continue
		}
		s.Queries += st.Queries
		s.Probes += st.Probes
	}
	return s, nil
}
