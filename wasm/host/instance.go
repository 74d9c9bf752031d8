package host

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"sync"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wasm/abi"
)

// Instance is one consumer module instance behind the client.Lanes interface.
// It is safe for concurrent use: a mutex serializes calls, because a wazero
// module instance runs one call at a time. The lock costs ≈ 20 ns
// uncontended; under contention callers queue, so spread queries over a
// [Pool] when one instance saturates a core.
//
// When a call traps (which the module's own recovery should make impossible)
// the instance is discarded, a fresh one is configured with the same
// manifest, every lane's last assigned epoch is restored (so stale epochs
// stay stale), and the call returns an error matching [ErrInstanceReset].
type Instance struct {
	mu       sync.Mutex
	rt       *Runtime
	m        *module // nil once closed
	manifest consumer.Manifest
	enc      []byte // manifest encoding, for resets

	// assigned[l] is the last successful assignment of lane l, replayed
	// (assign then retire) after a reset to restore the epoch floor.
	assigned [ckf.MaxLanes]*assignment
	resets   int
}

type assignment struct {
	identity ckf.ProducerIdentity
	lease    ckf.LaneLease
}

// NewInstance instantiates the module and configures it with m. A manifest
// that fails validation is an error matching consumer.ErrInvalidManifest.
func (r *Runtime) NewInstance(ctx context.Context, m consumer.Manifest) (*Instance, error) {
	in := &Instance{rt: r, manifest: m, enc: abi.AppendManifest(nil, &m)}
	// Registered before it has a module, under its own lock, so a
	// concurrent Runtime.Close either sees it (and waits for the lock) or
	// has already marked the runtime closed.
	in.mu.Lock()
	defer in.mu.Unlock()
	if !r.register(in) {
		return nil, ErrClosed
	}
	mod, err := in.fresh(ctx)
	if err != nil {
		r.unregister(in)
		return nil, err
	}
	in.m = mod
	return in, nil
}

// register adds in to the instances Close must close; false once closed.
func (r *Runtime) register(in *Instance) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.live[in] = struct{}{}
	return true
}

func (r *Runtime) unregister(in *Instance) {
	r.mu.Lock()
	delete(r.live, in)
	r.mu.Unlock()
}

// fresh instantiates and configures a module with the manifest.
func (in *Instance) fresh(ctx context.Context) (*module, error) {
	mod, err := in.rt.instantiate(ctx)
	if err != nil {
		return nil, err
	}
	if err := mod.setup(); err != nil {
		mod.close()
		return nil, err
	}
	p, v, err := mod.input(len(in.enc))
	if err == nil {
		copy(v, in.enc)
		err = mod.check("configure", abi.ExportConfigure, uint64(p), uint64(len(in.enc)))
	}
	if err != nil {
		mod.close()
		return nil, err
	}
	return mod, nil
}

// check calls an export that returns 0 or a negative code.
func (m *module) check(op string, fn abi.Export, params ...uint64) error {
	v, err := m.call(fn, params...)
	if err != nil {
		return err
	}
	if c := abi.Code(int32(v)); c < 0 {
		return &Error{Op: op, Code: c, Message: m.lastError()}
	}
	return nil
}

// Close releases the instance, after any call in flight. Later calls
// return [ErrClosed].
func (in *Instance) Close() error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.m != nil {
		in.m.close()
		in.m = nil
	}
	in.rt.unregister(in)
	return nil
}

// Resets returns how many times the instance was rebuilt after a trap.
func (in *Instance) Resets() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.resets
}

// Manifest returns the manifest the instance was configured with.
func (in *Instance) Manifest() consumer.Manifest { return in.manifest }

// do runs f on the live module under the lock; a trap (any error that is
// not an *Error) resets the instance.
func (in *Instance) do(f func(m *module) error) error {
	m, err := in.lock()
	if err != nil {
		return err
	}
	return in.unlock(f(m))
}

// lock takes the instance lock and returns the live module; on error the
// lock is already released. Hot paths use lock/unlock directly instead of
// do, so no closure escapes to the heap.
func (in *Instance) lock() (*module, error) {
	in.mu.Lock()
	if in.m == nil {
		in.mu.Unlock()
		return nil, ErrClosed
	}
	return in.m, nil
}

// unlock finishes a call started by lock: a trap resets the instance.
func (in *Instance) unlock(err error) error {
	defer in.mu.Unlock()
	if err == nil {
		return nil
	}
	if _, ok := err.(*Error); ok {
		return err
	}
	return in.resetLocked(err)
}

func (in *Instance) resetLocked(cause error) error {
	in.m.close()
	in.m = nil
	in.resets++
	mod, err := in.fresh(context.Background())
	if err != nil {
		return fmt.Errorf("%w (rebuild failed: %v): %v", ErrInstanceReset, err, cause)
	}
	for l, a := range in.assigned {
		if a == nil {
			continue
		}
		enc := abi.AppendAssignment(nil, &a.identity, &a.lease)
		p, v, err := mod.input(len(enc))
		if err == nil {
			copy(v, enc)
			err = mod.check("assign", abi.ExportAssign, uint64(p), uint64(len(enc)))
		}
		if err == nil {
			err = mod.check("retire", abi.ExportRetire, uint64(l))
		}
		if err != nil {
			mod.close()
			return fmt.Errorf("%w (epoch restore failed: %v): %v", ErrInstanceReset, err, cause)
		}
	}
	in.m = mod
	return fmt.Errorf("%w: %v", ErrInstanceReset, cause)
}

// Assign implements client.Lanes.
func (in *Instance) Assign(identity ckf.ProducerIdentity, lease ckf.LaneLease) error {
	return in.do(func(m *module) error {
		var buf [160]byte
		enc := abi.AppendAssignment(buf[:0], &identity, &lease)
		p, v, err := m.input(len(enc))
		if err != nil {
			return err
		}
		copy(v, enc)
		if err := m.check("assign", abi.ExportAssign, uint64(p), uint64(len(enc))); err != nil {
			return err
		}
		if int(lease.PhysicalLane) < len(in.assigned) {
			in.assigned[lease.PhysicalLane] = &assignment{identity, lease}
		}
		return nil
	})
}

// Retire implements client.Lanes.
func (in *Instance) Retire(lane int) error {
	return in.do(func(m *module) error {
		if lane < 0 || lane > 1<<16 {
			return &Error{Op: "retire", Code: abi.ErrWrongLane}
		}
		return m.check("retire", abi.ExportRetire, uint64(lane))
	})
}

// ApplyFrame implements client.Lanes.
func (in *Instance) ApplyFrame(frame []byte) (consumer.Result, error) {
	res := consumer.Result{Lane: -1}
	if len(frame) > consumer.MaxInputBytes {
		// The native consumer's answer (wire.ErrFrameTooLarge), before the
		// module is asked for a buffer it would refuse.
		return res, &Error{Op: "apply", Code: abi.ErrFrameTooLarge,
			Message: fmt.Sprintf("frame of %d bytes exceeds the consumer's %d", len(frame), consumer.MaxInputBytes)}
	}
	err := in.do(func(m *module) error {
		p, v, err := m.input(len(frame))
		if err != nil {
			return err
		}
		copy(v, frame)
		code, err := m.call(abi.ExportApply, uint64(p), uint64(len(frame)))
		if err != nil {
			return err
		}
		if c := abi.Code(int32(code)); c < 0 {
			return &Error{Op: "apply", Code: c, Message: m.lastError()}
		}
		if _, err := m.call(abi.ExportLastResult, uint64(m.out)); err != nil {
			return err
		}
		res = abi.ReadResult(m.record(abi.ResultSize)).Result
		return nil
	})
	return res, err
}

// abiBlockSize maps a block size to the module's signed i32 argument: a
// negative one is invalid like 0, and one above 2^31−1 is passed as 2^31−1.
// That answers exactly as the native consumer does: an input holds at most
// consumer.MaxInputBytes/4 = 2^24 tokens, so neither block size leaves a
// complete block (docs/abi.md §3).
func abiBlockSize(bs int) int32 {
	return int32(min(max(bs, 0), math.MaxInt32))
}

// query writes the input (count elements of width bytes; fill encodes
// them), calls query and reads the record into res. An input above
// consumer.MaxInputBytes is refused before any call, with the native
// consumer's error (ErrInvalidQuery).
func (in *Instance) query(kind int, count, width int, fill func(b []byte), blockSize int, salt uint64, res *consumer.QueryResult) error {
	if res == nil {
		return consumer.ErrInvalidQuery
	}
	if n := uint64(count) * uint64(width); n > consumer.MaxInputBytes {
		return fmt.Errorf("%w: input of %d bytes exceeds the %d-byte limit", consumer.ErrInvalidQuery, n, consumer.MaxInputBytes)
	}
	m, err := in.lock()
	if err != nil {
		return err
	}
	return in.unlock(m.query(kind, count, width, fill, blockSize, salt, res))
}

func (m *module) query(kind int, count, width int, fill func(b []byte), blockSize int, salt uint64, res *consumer.QueryResult) error {
	bs := abiBlockSize(blockSize)
	p, v, err := m.input(count * width)
	if err != nil {
		return err
	}
	fill(v)
	code, err := m.call(abi.ExportQuery, uint64(kind), uint64(p), uint64(count), uint64(uint32(bs)), salt, uint64(m.out))
	if err != nil {
		return err
	}
	c := abi.Code(int32(code))
	if c >= 0 || c == abi.ErrUnavailable {
		abi.ReadQueryRecord(m.record(abi.QueryRecordSize), res)
	}
	if c < 0 {
		return &Error{Op: "query", Code: c, Message: m.lastError()}
	}
	return nil
}

// Query implements client.Lanes.
func (in *Instance) Query(locals []uint64, res *consumer.QueryResult) error {
	return in.query(abi.QueryLocalHashes, len(locals), 8, func(b []byte) { abi.PutUint64s(b, locals) }, 0, 0, res)
}

// QuerySequenceHashes implements client.Lanes.
func (in *Instance) QuerySequenceHashes(seq []uint64, res *consumer.QueryResult) error {
	return in.query(abi.QuerySequenceHashes, len(seq), 8, func(b []byte) { abi.PutUint64s(b, seq) }, 0, 0, res)
}

// QueryTokens implements client.Lanes.
func (in *Instance) QueryTokens(tokens []uint32, blockSize int, salt uint64, res *consumer.QueryResult) error {
	return in.query(abi.QueryTokens, len(tokens), 4, func(b []byte) { abi.PutUint32s(b, tokens) }, blockSize, salt, res)
}

// QueryTokensWith implements client.Lanes: query kind abi.QueryTokensWith,
// the request in the token query layout (abi.PutTokenQuery). A module
// older than that kind answers an *Error with abi.ErrBadArgument.
func (in *Instance) QueryTokensWith(tokens []uint32, blockSize int, salt uint64, o ckf.HashOptions, res *consumer.QueryResult) error {
	n := abi.TokenQuerySize(len(tokens), o)
	if n < 0 || n > consumer.MaxInputBytes {
		return fmt.Errorf("%w: token query of %d tokens and %d multimodal lists exceeds the %d-byte limit", consumer.ErrInvalidQuery, len(tokens), len(o.MM), consumer.MaxInputBytes)
	}
	return in.query(abi.QueryTokensWith, n, 1, func(b []byte) { abi.PutTokenQuery(b, tokens, o) }, blockSize, salt, res)
}

// Contains implements client.Lanes.
func (in *Instance) Contains(seqHash uint64) (uint16, error) {
	m, err := in.lock()
	if err != nil {
		return 0, err
	}
	v, err := m.call(abi.ExportContains, seqHash)
	if err == nil {
		if c := abi.Code(int32(v)); c < 0 {
			err = &Error{Op: "contains", Code: c, Message: m.lastError()}
		}
	}
	if err = in.unlock(err); err != nil {
		return 0, err
	}
	return uint16(v), nil
}

// LaneStatus implements client.Lanes. The producer identity is rebuilt from
// the manifest (see abi.ReadLaneStatus).
func (in *Instance) LaneStatus(lane int) (consumer.LaneStatus, error) {
	var s consumer.LaneStatus
	err := in.do(func(m *module) error {
		if lane < 0 || lane > 1<<16 {
			return &Error{Op: "lane_status", Code: abi.ErrWrongLane}
		}
		if err := m.check("lane_status", abi.ExportLaneStatus, uint64(lane), uint64(m.out)); err != nil {
			return err
		}
		s = abi.ReadLaneStatus(m.record(abi.LaneStatusSize), &in.manifest, lane)
		return nil
	})
	return s, err
}

// AppendLaneWords implements client.Lanes. The buffer is sized by the
// lane's own format (its lane_status record), so lanes of every format
// read alike.
func (in *Instance) AppendLaneWords(dst []uint64, lane int) ([]uint64, error) {
	err := in.do(func(m *module) error {
		if lane < 0 || lane > 1<<16 {
			return &Error{Op: "lane_words", Code: abi.ErrWrongLane}
		}
		if err := m.check("lane_status", abi.ExportLaneStatus, uint64(lane), uint64(m.out)); err != nil {
			return err
		}
		n := int(abi.ReadLaneStatus(m.record(abi.LaneStatusSize), &in.manifest, lane).Format.BucketCount)
		p, _, err := m.input(8 * n)
		if err != nil {
			return err
		}
		c, err := m.call(abi.ExportLaneWords, uint64(lane), uint64(p), uint64(8*n))
		if err != nil {
			return err
		}
		if c := abi.Code(int32(c)); c < 0 {
			return &Error{Op: "lane_words", Code: c, Message: m.lastError()}
		}
		v, _ := m.mem.Read(p, uint32(8*int(int32(c))))
		for i := range int(int32(c)) {
			dst = append(dst, binary.LittleEndian.Uint64(v[8*i:]))
		}
		return nil
	})
	return dst, err
}

// Stats implements client.Lanes.
func (in *Instance) Stats() (consumer.Stats, error) {
	var s consumer.Stats
	err := in.do(func(m *module) error {
		if err := m.check("stats", abi.ExportStats, uint64(m.out)); err != nil {
			return err
		}
		s = abi.ReadStats(m.record(abi.StatsSize))
		return nil
	})
	return s, err
}

// LiveBuffers returns how many guest buffers the host holds (a leak check:
// the scratch and record buffers, so 2 in steady state).
func (in *Instance) LiveBuffers() (int, error) {
	var n int
	err := in.do(func(m *module) error {
		v, err := m.call(abi.ExportLiveBuffers)
		n = int(int32(v))
		return err
	})
	return n, err
}
