package client

import (
	"sync"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wire"
)

// Lanes is a consumer seen from outside: the 16 lanes of one consumer table,
// fed encoded frames and queried by prefix. It is the one interface the
// project's consumers share: [*Native] implements it in-process, and the
// WebAssembly host (wasm/host: *host.Instance, *host.Pool) implements it
// with the module, so a router switches between them with one line.
//
// Methods have the semantics of the consumer.Consumer methods of the same
// names (SPEC §8). ApplyFrame takes one encoded frame body (the msgpack
// array, without the 4-byte length prefix), does not retain it, and returns
// a decode failure as an error matching the wire sentinels (wire.ErrMalformed,
// …) with Result Lane -1; nothing changed then. Every error matches the
// consumer and wire sentinels with errors.Is, whatever the implementation.
// Implementations are safe for concurrent use.
//
// Every implementation caps its inputs at consumer.MaxInputBytes (64 MiB): a
// larger frame body is wire.ErrFrameTooLarge and a larger query (8 bytes a
// hash, 4 a token) consumer.ErrInvalidQuery, before anything changes. Any
// token block size ≥ 1 is valid; one above the token count (any above 2^31−1
// included) leaves no complete block. AppendLaneWords on a lane that is not
// ready is consumer.ErrUnavailable with no words.
//
// A [Router] uses Assign, Retire, ApplyFrame, QuerySequenceHashes, Contains
// and AppendLaneWords, and serializes its own calls; the other methods serve
// routers that hash tokens themselves and tools that inspect lanes.
type Lanes interface {
	// Assign grants a lane to a producer identity under a lease.
	Assign(identity ckf.ProducerIdentity, lease ckf.LaneLease) error
	// Retire makes a lane not ready and forgets its lease.
	Retire(lane int) error
	// ApplyFrame applies one frame body (without its length prefix).
	ApplyFrame(frame []byte) (consumer.Result, error)
	// Query answers per ready lane how many leading blocks of a request,
	// given as local block hashes, are present.
	Query(locals []uint64, res *consumer.QueryResult) error
	// QuerySequenceHashes is Query for already chained (canonical) hashes.
	QuerySequenceHashes(seq []uint64, res *consumer.QueryResult) error
	// QueryTokens is Query for token ids, hashed in blocks of blockSize.
	QueryTokens(tokens []uint32, blockSize int, salt uint64, res *consumer.QueryResult) error
	// QueryTokensWith is QueryTokens with per-block multimodal hashes and
	// Eagle windows (consumer.Consumer.QueryTokensWith); the cache
	// namespace rides in salt (ckf.Salt).
	QueryTokensWith(tokens []uint32, blockSize int, salt uint64, o ckf.HashOptions, res *consumer.QueryResult) error
	// Contains returns the ready lanes whose filter holds a sequence hash.
	Contains(seqHash uint64) (uint16, error)
	// LaneStatus reports one lane's assignment, readiness and counters.
	LaneStatus(lane int) (consumer.LaneStatus, error)
	// AppendLaneWords appends a ready lane's bucket words in bucket order;
	// a lane that is not ready is consumer.ErrUnavailable and dst unchanged.
	AppendLaneWords(dst []uint64, lane int) ([]uint64, error)
	// Stats reports the table's size and query counters.
	Stats() (consumer.Stats, error)
}

var _ Lanes = (*Native)(nil)

// DecodedApplier is a [Lanes] that also applies a frame already decoded,
// with the semantics of ApplyFrame on its encoding (the frame's size is the
// transport's to bound: gRPC's messages are at most 8 MiB). A transport that decodes
// another encoding (gRPC's CBI1) installs through it without encoding wire
// v1 only for the consumer to decode it again; [Session] uses it when its
// Lanes has it, and otherwise encodes the frame once for ApplyFrame (the
// WebAssembly host takes bytes: the frame has to cross into the module's
// memory anyway). The frame's slices are only read and not retained.
type DecodedApplier interface {
	Lanes
	ApplyDecodedFrame(f *wire.Frame) (consumer.Result, error)
}

var _ DecodedApplier = (*Native)(nil)

// Native is the in-process consumer behind [Lanes]: a *consumer.Consumer and
// a mutex. Frames are decoded in place by consumer.ApplyFrameBytes, the path
// the WebAssembly module uses too; errors are the consumer's and wire's own.
//
// Build it with [NewNative]; the zero value is not usable. The consumer is
// reachable only through Native's methods, so every call holds the mutex.
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

// Assign implements [Lanes].
func (n *Native) Assign(identity ckf.ProducerIdentity, lease ckf.LaneLease) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.c.Assign(identity, lease)
}

// Retire implements [Lanes].
func (n *Native) Retire(lane int) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.c.Retire(lane)
}

// ApplyFrame implements [Lanes] with consumer.ApplyFrameBytes.
func (n *Native) ApplyFrame(frame []byte) (consumer.Result, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.c.ApplyFrameBytes(frame)
}

// ApplyDecodedFrame implements [DecodedApplier] with consumer.ApplyFrame.
func (n *Native) ApplyDecodedFrame(f *wire.Frame) (consumer.Result, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.c.ApplyFrame(f), nil
}

// Query implements [Lanes].
func (n *Native) Query(locals []uint64, res *consumer.QueryResult) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.c.Query(locals, res)
}

// QuerySequenceHashes implements [Lanes].
func (n *Native) QuerySequenceHashes(seq []uint64, res *consumer.QueryResult) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.c.QuerySequenceHashes(seq, res)
}

// QueryTokens implements [Lanes].
func (n *Native) QueryTokens(tokens []uint32, blockSize int, salt uint64, res *consumer.QueryResult) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.c.QueryTokens(tokens, blockSize, salt, res)
}

// QueryTokensWith implements [Lanes].
func (n *Native) QueryTokensWith(tokens []uint32, blockSize int, salt uint64, o ckf.HashOptions, res *consumer.QueryResult) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.c.QueryTokensWith(tokens, blockSize, salt, o, res)
}

// Contains implements [Lanes].
func (n *Native) Contains(seqHash uint64) (uint16, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.c.Contains(seqHash)
}

// LaneStatus implements [Lanes].
func (n *Native) LaneStatus(lane int) (consumer.LaneStatus, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.c.LaneStatus(lane)
}

// AppendLaneWords implements [Lanes].
func (n *Native) AppendLaneWords(dst []uint64, lane int) ([]uint64, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.c.AppendLaneWords(dst, lane)
}

// Stats implements [Lanes]; the error is always nil.
func (n *Native) Stats() (consumer.Stats, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.c.Stats(), nil
}
