// Command guest is the ckfrelay consumer as a WebAssembly reactor module
// (SPEC §10, docs/abi.md). Build it with `go run ./cmd/wasmbuild`; the result
// is embedded in wasm/host.
//
// The package is split so that everything but the export shims is plain Go
// tested natively: guest.go holds the state and the byte-level logic over
// consumer and wire, exports_wasip1.go holds the //go:wasmexport functions
// that turn (pointer, length) pairs into slices, check them against the
// allocation registry, recover panics and call into guest.go. The module is
// single-threaded and starts no goroutine (docs/RATIONALE.md, "Why is the
// wasm consumer shaped the way it is?").
package main

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wasm/abi"
	"github.com/ckfrelay/ckfrelay/wire"
)

func main() {}

// guest is the module's whole state. One exists per instance (a package
// variable in the exports); tests make their own.
type guest struct {
	c        *consumer.Consumer
	manifest consumer.Manifest

	last    abi.Result // detail of the last apply
	lastErr string     // message of the last failed call

	res    consumer.QueryResult
	hashes []uint64 // query input scratch
	tokens []uint32
	mm     []uint64   // multimodal hashes of a QueryTokensWith input (scratch)
	lists  [][]uint64 // their per-block lists (scratch)
}

// fail records err's message for last_error and returns code.
func (g *guest) fail(code abi.Code, err error) abi.Code {
	if err != nil {
		g.lastErr = err.Error()
	} else {
		g.lastErr = code.String()
	}
	return code
}

// configure decodes and validates a manifest and replaces the consumer with
// a fresh one (every lane unassigned). On failure the previous consumer, if
// any, stays as it was.
func (g *guest) configure(b []byte) abi.Code {
	m, err := abi.DecodeManifest(b)
	if err != nil {
		return g.fail(abi.ErrManifestEncoding, err)
	}
	if err := m.Validate(); err != nil {
		return g.fail(abi.ErrInvalidManifest, err)
	}
	for i := range m.Lanes {
		if f := m.LaneFormat(i); m.Lanes[i] != nil && f.BucketCount > abi.MaxTableBytes/(8*ckf.MaxLanes) {
			return g.fail(abi.ErrOutOfMemory, fmt.Errorf("abi: table of %d buckets × 16 lanes exceeds %d bytes", f.BucketCount, abi.MaxTableBytes))
		}
	}
	// Drop the old table before allocating the new one so the GC can reuse
	// its memory: wasm linear memory never shrinks.
	g.c = nil
	c, err := consumer.New(m)
	if err != nil {
		return g.fail(abi.CodeOf(err), err)
	}
	g.c, g.manifest = c, m
	g.last = abi.Result{}
	return abi.OK
}

func (g *guest) assign(b []byte) abi.Code {
	if g.c == nil {
		return g.fail(abi.ErrNotConfigured, nil)
	}
	id, lease, err := abi.DecodeAssignment(b)
	if err != nil {
		return g.fail(abi.ErrAssignmentEncoding, err)
	}
	// Lanes of many large formats could outgrow wasm32's memory; the Go
	// runtime's out-of-memory is fatal (a trap), so refuse first. A
	// version-1 manifest's table was checked by configure.
	if n := g.c.TableBytesAfterAssign(int(lease.PhysicalLane), id.Format); id.Format.Validate() == nil && n > abi.MaxTableBytes {
		return g.fail(abi.ErrOutOfMemory, fmt.Errorf("abi: lane %d in format of %d buckets would make the tables %d bytes, above %d", lease.PhysicalLane, id.Format.BucketCount, n, abi.MaxTableBytes))
	}
	if err := g.c.Assign(id, lease); err != nil {
		return g.fail(abi.CodeOf(err), err)
	}
	return abi.OK
}

func (g *guest) retire(lane int32) abi.Code {
	if g.c == nil {
		return g.fail(abi.ErrNotConfigured, nil)
	}
	if err := g.c.Retire(int(lane)); err != nil {
		return g.fail(abi.CodeOf(err), err)
	}
	return abi.OK
}

// apply decodes one frame body and applies it. It returns the outcome (≥ 1)
// or a negative decode code; last_result holds the detail either way.
func (g *guest) apply(b []byte) abi.Code {
	if g.c == nil {
		g.last = abi.Result{Code: abi.ErrNotConfigured, Result: consumer.Result{Lane: -1}}
		return g.fail(abi.ErrNotConfigured, nil)
	}
	r, err := g.c.ApplyFrameBytes(b)
	if err != nil {
		code := abi.CodeOf(err)
		g.last = abi.Result{Code: code, Result: consumer.Result{Lane: -1}}
		var de *wire.DecodeError
		if errors.As(err, &de) {
			g.last.Kind = uint8(de.Frame)
			g.last.ErrorOff = uint32(max(de.Offset, 0))
		}
		return g.fail(code, err)
	}
	g.last = abi.Result{Code: abi.Code(r.Outcome), Result: r, Kind: peekKind(b)}
	return abi.Code(r.Outcome)
}

// peekKind returns the kind of a frame that decoded: the second element of
// its top-level array, a positive fixint in every v1 frame.
func peekKind(b []byte) uint8 {
	i := 1 // fixarray
	switch {
	case len(b) > 0 && b[0] == 0xdc:
		i = 3
	case len(b) > 0 && b[0] == 0xdd:
		i = 5
	}
	if i+1 < len(b) && b[i+1] < 0x80 {
		return b[i+1]
	}
	return 0
}

// frameLane returns the lane frame b addresses, or -1. The export shim uses
// it to take that lane out of service when apply panicked (SPEC §5
// ConsumerWorkerFailureMidApply: its words are uncertain).
func (g *guest) frameLane(b []byte) int {
	var f wire.Frame
	if wire.DecodeFrameView(b, &f) != nil {
		return -1
	}
	l, ok := f.Lease()
	if !ok || l.PhysicalLane >= ckf.MaxLanes {
		return -1
	}
	return int(l.PhysicalLane)
}

// query reads the input array of the given kind, runs the query and writes
// the query record (abi.QueryRecordSize bytes) into out. It returns the
// captured ready mask (≥ 0) or a negative code. With no ready lane the record
// is still written (mask 0, depths 0) and the code is ErrUnavailable.
func (g *guest) query(kind int32, in []byte, count int, blockSize int, salt uint64, out []byte) abi.Code {
	if g.c == nil {
		return g.fail(abi.ErrNotConfigured, nil)
	}
	if len(out) < abi.QueryRecordSize {
		return g.fail(abi.ErrBufferTooSmall, nil)
	}
	var err error
	switch kind {
	case abi.QueryLocalHashes, abi.QuerySequenceHashes:
		if count < 0 || len(in) < 8*count {
			return g.fail(abi.ErrBadArgument, errors.New("abi: hash array outside its buffer"))
		}
		hashes := uint64s(in[:8*count], &g.hashes)
		if kind == abi.QueryLocalHashes {
			err = g.c.Query(hashes, &g.res)
		} else {
			err = g.c.QuerySequenceHashes(hashes, &g.res)
		}
	case abi.QueryTokens:
		if count < 0 || len(in) < 4*count {
			return g.fail(abi.ErrBadArgument, errors.New("abi: token array outside its buffer"))
		}
		err = g.c.QueryTokens(uint32s(in[:4*count], &g.tokens), blockSize, salt, &g.res)
	case abi.QueryTokensWith:
		if count < 0 || len(in) < count {
			return g.fail(abi.ErrBadArgument, errors.New("abi: token query outside its buffer"))
		}
		q, perr := abi.ParseTokenQuery(in[:count])
		if perr != nil {
			return g.fail(abi.ErrBadArgument, perr)
		}
		o := ckf.HashOptions{Eagle: q.Eagle}
		if len(q.Lengths) > 0 {
			g.lists = q.Lists(g.lists[:0], uint64s(q.MM, &g.mm))
			o.MM = g.lists
		}
		err = g.c.QueryTokensWith(uint32s(q.Tokens, &g.tokens), blockSize, salt, o, &g.res)
		clear(g.lists) // drop the views into the host's buffer
	default:
		return g.fail(abi.ErrBadArgument, fmt.Errorf("abi: unknown query kind %d", kind))
	}
	putQueryRecord(out, &g.res)
	if err != nil {
		return g.fail(abi.CodeOf(err), err)
	}
	return abi.Code(g.res.Mask)
}

func (g *guest) contains(h uint64) abi.Code {
	if g.c == nil {
		return g.fail(abi.ErrNotConfigured, nil)
	}
	mask, err := g.c.Contains(h)
	if err != nil {
		return g.fail(abi.CodeOf(err), err)
	}
	return abi.Code(mask)
}

func (g *guest) laneStatus(lane int32, out []byte) abi.Code {
	if g.c == nil {
		return g.fail(abi.ErrNotConfigured, nil)
	}
	if len(out) < abi.LaneStatusSize {
		return g.fail(abi.ErrBufferTooSmall, nil)
	}
	s, err := g.c.LaneStatus(int(lane))
	if err != nil {
		return g.fail(abi.CodeOf(err), err)
	}
	abi.PutLaneStatus(out, &s)
	return abi.OK
}

// laneWords writes lane i's column (its format's bucket_count u64 LE
// words) into out and returns the number of words. Only a ready lane has
// words (Unavailable otherwise), checked before the buffer's size.
func (g *guest) laneWords(lane int32, out []byte) abi.Code {
	if g.c == nil {
		return g.fail(abi.ErrNotConfigured, nil)
	}
	words, err := g.c.AppendLaneWords(g.hashes[:0], int(lane))
	g.hashes = words[:0]
	if err != nil {
		return g.fail(abi.CodeOf(err), err)
	}
	if len(out) < 8*len(words) {
		return g.fail(abi.ErrBufferTooSmall, fmt.Errorf("abi: lane_words needs %d bytes, got %d", 8*len(words), len(out)))
	}
	for i, w := range words {
		binary.LittleEndian.PutUint64(out[8*i:], w)
	}
	return abi.Code(len(words))
}

func (g *guest) stats(out []byte) abi.Code {
	if g.c == nil {
		return g.fail(abi.ErrNotConfigured, nil)
	}
	if len(out) < abi.StatsSize {
		return g.fail(abi.ErrBufferTooSmall, nil)
	}
	s := g.c.Stats()
	abi.PutStats(out, &s)
	return abi.OK
}
