package consumer

import (
	"fmt"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// MaxInputBytes bounds every input a consumer takes in one call, natively
// and in the WebAssembly module alike (whose alloc export hands out no
// larger buffer): a frame body, or a query as the module's ABI encodes it —
// 8 bytes a hash, 4 a token, and for [Consumer.QueryTokensWith] the token
// query layout ([TokenQueryBytes]). A larger frame is refused with
// wire.ErrFrameTooLarge and a larger query with [ErrInvalidQuery], before
// anything changes. 64 MiB is 16,777,216 tokens or 8,388,608 blocks: far
// beyond any request, and eight times the relay's default frame limit.
const MaxInputBytes = 64 << 20

// TokenQueryBytes is the size of a token query in the module's layout
// (docs/abi.md §3.1): a 16-byte header, 4 bytes a token and a multimodal
// list length, zero padding to 8 bytes, 8 bytes a multimodal hash.
func TokenQueryBytes(nTokens int, o ckf.HashOptions) uint64 {
	var nMM uint64
	for _, l := range o.MM {
		nMM += uint64(len(l))
	}
	n := 16 + 4*uint64(nTokens) + 4*uint64(len(o.MM))
	return (n+7)&^7 + 8*nMM
}

// tooLarge is the error of a query whose input exceeds MaxInputBytes.
func tooLarge(n uint64) error {
	return fmt.Errorf("%w: input of %d bytes exceeds the %d-byte limit", ErrInvalidQuery, n, MaxInputBytes)
}

// QueryResult is filled by the query methods. The caller owns it and may
// reuse it across queries; queries never allocate it.
type QueryResult struct {
	// Mask is the ready mask captured once when the query started. Depths[l]
	// is meaningful exactly when bit l is set; other entries are 0.
	Mask uint16
	// Depths[l] is the number of leading blocks lane l holds (0..Blocks).
	Depths [ckf.MaxLanes]uint32
	// Blocks is the number of blocks the query asked about.
	Blocks int
	// Probes is the number of logical table probes the query made (one a
	// position: two rows of every format group); at most Blocks.
	Probes int
}

// Query answers how many leading blocks of a request each ready lane holds,
// given the request's local block hashes (tokens_hash per block, SPEC §3).
// It chains them into canonical sequence hashes in reused scratch, then runs
// the prefix search of SPEC §8.4. With no ready lane it returns
// [ErrUnavailable] and res.Mask = 0. locals is only read. After a query of
// the same or greater length, Query does not allocate. More than
// MaxInputBytes/8 hashes is [ErrInvalidQuery] ([MaxInputBytes]).
func (c *Consumer) Query(locals []uint64, res *QueryResult) error {
	if res == nil {
		return ErrInvalidQuery
	}
	if n := 8 * uint64(len(locals)); n > MaxInputBytes {
		return tooLarge(n)
	}
	q := &c.q
	q.seq = ckf.AppendSequenceHashes(q.seq[:0], locals)
	return c.run(res, false)
}

// QuerySequenceHashes is [Consumer.Query] for hashes that are already the
// canonical chain. seq is only read and not retained.
func (c *Consumer) QuerySequenceHashes(seq []uint64, res *QueryResult) error {
	if n := 8 * uint64(len(seq)); n > MaxInputBytes {
		return tooLarge(n)
	}
	if hasSearchKernel { // a constant: this inlines into the caller either way
		return c.runKernel(seq, res)
	}
	return c.runOn(seq, res, false)
}

// QuerySequenceHashesLinear is the exact reference search (a linear scan that
// stops at each lane's first miss) over already-chained hashes. It exists to
// check and compare the fast search; routers should use the fast one.
func (c *Consumer) QuerySequenceHashesLinear(seq []uint64, res *QueryResult) error {
	if n := 8 * uint64(len(seq)); n > MaxInputBytes {
		return tooLarge(n)
	}
	return c.runOn(seq, res, true)
}

// runOn runs a search over the caller's already-chained hashes, lending them
// to the query scratch for the call only (seq is not retained).
func (c *Consumer) runOn(seq []uint64, res *QueryResult, linear bool) error {
	if res == nil {
		return ErrInvalidQuery
	}
	saved := c.q.seq
	c.q.seq = seq
	err := c.run(res, linear)
	c.q.seq = saved
	return err
}

// QueryTokens hashes tokens into complete blocks of blockSize tokens with the
// given salt (see [ckf.Salt]; a trailing partial block is ignored), chains
// them and answers like [Consumer.Query]. blockSize must be > 0
// ([ErrInvalidQuery] otherwise); any larger block size is valid, and one
// above the token count leaves no complete block (Blocks 0, every depth 0).
// The WebAssembly module takes block sizes up to 2^32−1 and its hosts pass
// a larger one as 2^32−1, which answers the same: with at most
// MaxInputBytes/4 tokens neither holds a complete block. More than
// MaxInputBytes/4 tokens is [ErrInvalidQuery]. It does not allocate: on
// little-endian targets ckf hashes the tokens in place.
func (c *Consumer) QueryTokens(tokens []uint32, blockSize int, salt uint64, res *QueryResult) error {
	if res == nil || blockSize <= 0 {
		return ErrInvalidQuery
	}
	if n := 4 * uint64(len(tokens)); n > MaxInputBytes {
		return tooLarge(n)
	}
	q := &c.q
	q.seq = ckf.AppendTokenSequenceHashes(q.seq[:0], tokens, blockSize, salt)
	return c.run(res, false)
}

// QueryTokensWith is [Consumer.QueryTokens] with the per-request hash
// inputs Dynamo's router uses beyond the salt (which carries the LoRA name
// and the cache namespace: [ckf.Salt]): per-block multimodal hashes and
// Eagle windows ([ckf.HashOptions], [ckf.AppendTokenSequenceHashesWith]).
// With zero options it answers exactly as QueryTokens. A request larger
// than MaxInputBytes in the module's token query layout ([TokenQueryBytes])
// is [ErrInvalidQuery].
func (c *Consumer) QueryTokensWith(tokens []uint32, blockSize int, salt uint64, o ckf.HashOptions, res *QueryResult) error {
	if res == nil || blockSize <= 0 {
		return ErrInvalidQuery
	}
	if n := TokenQueryBytes(len(tokens), o); n > MaxInputBytes {
		return tooLarge(n)
	}
	q := &c.q
	q.seq = ckf.AppendTokenSequenceHashesWith(q.seq[:0], tokens, blockSize, salt, o)
	return c.run(res, false)
}

// run searches c.q.seq over the ready lanes captured once here.
func (c *Consumer) run(res *QueryResult, linear bool) error {
	if hasSearchKernel && useSearchKernel && !linear {
		return c.runKernel(c.q.seq, res)
	}
	ready := c.ready
	*res = QueryResult{Mask: ready, Blocks: len(c.q.seq)}
	c.q.queries++
	if ready == 0 {
		return ErrUnavailable
	}
	if len(c.q.seq) == 0 {
		return nil
	}
	before := c.q.probes
	c.q.prepare(len(c.q.seq), !c.uniform)
	if linear {
		c.searchLinear(ready, &res.Depths)
	} else {
		c.searchFast(ready, &res.Depths)
	}
	res.Probes = int(c.q.probes - before)
	return nil
}

// Contains returns the ready lanes whose filter holds the canonical sequence
// hash seqHash (bit l = lane l). Like any cuckoo filter it may report a false
// positive (≈ 0.012% per lane at full load), never a false negative for a
// resident block. With no ready lane it returns [ErrUnavailable].
func (c *Consumer) Contains(seqHash uint64) (uint16, error) {
	ready := c.ready
	c.q.queries++
	if ready == 0 {
		return 0, ErrUnavailable
	}
	c.q.probes++
	return c.rowHits(seqHash, ready), nil
}
