package host

import (
	"sync"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
)

// Consumer is what a router needs from a consumer, implemented by [Native]
// (the consumer package in-process) and [Instance] (the WebAssembly module).
// Methods have the semantics of the consumer.Consumer methods of the same
// names (SPEC §8); ApplyFrame takes one encoded frame body (the msgpack
// array, without the 4-byte length prefix) and returns a decode failure as
// an error matching the wire sentinels (wire.ErrMalformed, …) with Result
// Lane -1. Errors match the consumer and wire sentinels with errors.Is in
// both implementations. Implementations are safe for concurrent use.
type Consumer interface {
	Assign(identity ckf.ProducerIdentity, lease ckf.LaneLease) error
	Retire(lane int) error
	ApplyFrame(frame []byte) (consumer.Result, error)
	Query(locals []uint64, res *consumer.QueryResult) error
	QuerySequenceHashes(seq []uint64, res *consumer.QueryResult) error
	QueryTokens(tokens []uint32, blockSize int, salt uint64, res *consumer.QueryResult) error
	Contains(seqHash uint64) (uint16, error)
	LaneStatus(lane int) (consumer.LaneStatus, error)
	AppendLaneWords(dst []uint64, lane int) ([]uint64, error)
	Stats() (consumer.Stats, error)
}

var (
	_ Consumer = (*Native)(nil)
	_ Consumer = (*Instance)(nil)
)

// Native is the in-process consumer behind the [Consumer] interface: a
// consumer.Consumer and a mutex. Its errors are the
// consumer's and wire's own.
type Native struct {
	mu sync.Mutex
	c  *consumer.Consumer
}

// NewNative validates m and builds a native consumer.
func NewNative(m consumer.Manifest) (*Native, error) {
	c, err := consumer.New(m)
	if err != nil {
		return nil, err
	}
	return &Native{c: c}, nil
}

// Assign implements [Consumer].
func (n *Native) Assign(identity ckf.ProducerIdentity, lease ckf.LaneLease) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.c.Assign(identity, lease)
}

// Retire implements [Consumer].
func (n *Native) Retire(lane int) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.c.Retire(lane)
}

// ApplyFrame implements [Consumer] with consumer.ApplyFrameBytes, the path
// the module uses too.
func (n *Native) ApplyFrame(frame []byte) (consumer.Result, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.c.ApplyFrameBytes(frame)
}

// Query implements [Consumer].
func (n *Native) Query(locals []uint64, res *consumer.QueryResult) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.c.Query(locals, res)
}

// QuerySequenceHashes implements [Consumer].
func (n *Native) QuerySequenceHashes(seq []uint64, res *consumer.QueryResult) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.c.QuerySequenceHashes(seq, res)
}

// QueryTokens implements [Consumer].
func (n *Native) QueryTokens(tokens []uint32, blockSize int, salt uint64, res *consumer.QueryResult) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.c.QueryTokens(tokens, blockSize, salt, res)
}

// Contains implements [Consumer].
func (n *Native) Contains(seqHash uint64) (uint16, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.c.Contains(seqHash)
}

// LaneStatus implements [Consumer].
func (n *Native) LaneStatus(lane int) (consumer.LaneStatus, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.c.LaneStatus(lane)
}

// AppendLaneWords implements [Consumer].
func (n *Native) AppendLaneWords(dst []uint64, lane int) ([]uint64, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.c.AppendLaneWords(dst, lane)
}

// Stats implements [Consumer]; the error is always nil.
func (n *Native) Stats() (consumer.Stats, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.c.Stats(), nil
}
