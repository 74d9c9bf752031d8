package wire

import (
	"math"
	"slices"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// Minimal encoded sizes used to cap preallocation by what the input can
// really hold: a block is a map with two keyed integers (≥ 26 bytes), a hash
// at least one byte, an event a map with worker_id and event (≥ 30 bytes).
const (
	minBlockBytes = 26
	minEventBytes = 30
)

// DecodeRouterEventMsgpack decodes one Dynamo RouterEvent in its msgpack map
// form (rmp_serde::to_vec_named, or any encoder writing structs as maps with
// field-name keys) into a [ckf.RouterEvent]. The accepted shape is in
// docs/wire.md: absent optional fields take Dynamo's defaults (storage_tier
// "device", dp_rank 0, parent_hash and start_position none), unknown fields
// are skipped, any msgpack integer width is accepted for integers, a
// duplicated field is [ErrMalformed]. The result's slices are freshly
// allocated and never alias data.
func DecodeRouterEventMsgpack(data []byte) (ckf.RouterEvent, error) {
	r := reader{b: data}
	ev, err := r.routerEvent(0)
	if err != nil {
		return ckf.RouterEvent{}, err
	}
	if err := r.end(); err != nil {
		return ckf.RouterEvent{}, err
	}
	return ev, nil
}

// DecodeRouterEventMsgpackLimited is [DecodeRouterEventMsgpack] with at
// most maxBlocks blocks (hashes) in the event (≤ 0: no limit): more fail
// with an [ErrLimitExceeded] error as soon as the array header is read.
func DecodeRouterEventMsgpackLimited(data []byte, maxBlocks int) (ckf.RouterEvent, error) {
	r := reader{b: data}
	ev, err := r.routerEvent(maxBlocks)
	if err != nil {
		return ckf.RouterEvent{}, err
	}
	if err := r.end(); err != nil {
		return ckf.RouterEvent{}, err
	}
	return ev, nil
}

// DecodeRouterEventsMsgpack decodes a msgpack array of RouterEvents (the
// batch form) and appends them to dst. On error it returns dst unchanged. It
// applies no batch limits: decode untrusted input with
// [DecodeRouterEventsMsgpackLimited].
func DecodeRouterEventsMsgpack(data []byte, dst []ckf.RouterEvent) ([]ckf.RouterEvent, error) {
	return DecodeRouterEventsMsgpackLimited(data, dst, BatchLimits{})
}

// DecodeRouterEventsMsgpackLimited is [DecodeRouterEventsMsgpack] under lim:
// an array header announcing more events than lim.MaxEvents, or more blocks
// (hashes) in one event than lim.MaxBlocksPerEvent, fails with an
// [ErrLimitExceeded] error as soon as it is read, before anything is
// allocated for it.
func DecodeRouterEventsMsgpackLimited(data []byte, dst []ckf.RouterEvent, lim BatchLimits) ([]ckf.RouterEvent, error) {
	r := reader{b: data, field: "events"}
	n, err := r.arrayLen()
	if err != nil {
		return dst, err
	}
	if lim.MaxEvents > 0 && n > lim.MaxEvents {
		return dst, r.fail(ErrLimitExceeded, itoa(n)+" events in one batch, limit "+itoa(lim.MaxEvents))
	}
	// A fresh backing array: dst's elements are never overwritten on error.
	out := slices.Grow(dst[:len(dst):len(dst)], min(n, r.remaining()/minEventBytes+1))
	for range n {
		ev, err := r.routerEvent(lim.MaxBlocksPerEvent)
		if err != nil {
			return dst, err
		}
		out = append(out, ev)
	}
	if err := r.end(); err != nil {
		return dst, err
	}
	return out, nil
}

// blockLimit fails with ErrLimitExceeded when an event's announced block (or
// hash) count m exceeds maxBlocks (≤ 0: no limit).
func (r *reader) blockLimit(m, maxBlocks int) error {
	if maxBlocks > 0 && m > maxBlocks {
		return r.fail(ErrLimitExceeded, itoa(m)+" blocks in one event, limit "+itoa(maxBlocks))
	}
	return nil
}

func (r *reader) key() ([]byte, error) {
	return r.str()
}

func (r *reader) dup(seen *uint32, bit uint32) error {
	if *seen&bit != 0 {
		return r.fail(ErrMalformed, "duplicate field")
	}
	*seen |= bit
	return nil
}

func (r *reader) routerEvent(maxBlocks int) (ckf.RouterEvent, error) {
	var ev ckf.RouterEvent
	r.field = "router_event"
	n, err := r.mapLen()
	if err != nil {
		return ev, err
	}
	var seen uint32
	const (
		fWorker = 1 << iota
		fTier
		fEvent
	)
	for range n {
		r.field = "router_event"
		k, err := r.key()
		if err != nil {
			return ev, err
		}
		switch string(k) {
		case "worker_id":
			r.field = "worker_id"
			if err := r.dup(&seen, fWorker); err != nil {
				return ev, err
			}
			if ev.WorkerID, err = r.uint(math.MaxUint64); err != nil {
				return ev, err
			}
		case "storage_tier":
			r.field = "storage_tier"
			if err := r.dup(&seen, fTier); err != nil {
				return ev, err
			}
			if r.isNil() {
				continue
			}
			at := r.off
			s, err := r.str()
			if err != nil {
				return ev, err
			}
			t, ok := ckf.ParseStorageTier(string(s))
			if !ok {
				r.off = at
				return ev, r.fail(ErrMalformed, "unknown storage tier "+quote(s))
			}
			ev.StorageTier = t
		case "event":
			r.field = "event"
			if err := r.dup(&seen, fEvent); err != nil {
				return ev, err
			}
			if err := r.kvEvent(&ev, maxBlocks); err != nil {
				return ev, err
			}
		default:
			r.field = "router_event"
			if err := r.skip(0); err != nil {
				return ev, err
			}
		}
	}
	switch {
	case seen&fWorker == 0:
		r.field = "worker_id"
		return ev, r.fail(ErrMalformed, "missing required field")
	case seen&fEvent == 0:
		r.field = "event"
		return ev, r.fail(ErrMalformed, "missing required field")
	}
	return ev, nil
}

func (r *reader) kvEvent(ev *ckf.RouterEvent, maxBlocks int) error {
	n, err := r.mapLen()
	if err != nil {
		return err
	}
	var seen uint32
	const (
		fID = 1 << iota
		fRank
		fData
	)
	for range n {
		r.field = "event"
		k, err := r.key()
		if err != nil {
			return err
		}
		switch string(k) {
		case "event_id":
			r.field = "event.event_id"
			if err := r.dup(&seen, fID); err != nil {
				return err
			}
			if ev.EventID, err = r.uint(math.MaxUint64); err != nil {
				return err
			}
		case "dp_rank":
			r.field = "event.dp_rank"
			if err := r.dup(&seen, fRank); err != nil {
				return err
			}
			if r.isNil() {
				continue
			}
			v, err := r.uint(math.MaxUint32)
			if err != nil {
				return err
			}
			ev.DPRank = uint32(v)
		case "data":
			r.field = "event.data"
			if err := r.dup(&seen, fData); err != nil {
				return err
			}
			if err := r.eventData(ev, maxBlocks); err != nil {
				return err
			}
		default:
			if err := r.skip(0); err != nil {
				return err
			}
		}
	}
	switch {
	case seen&fID == 0:
		r.field = "event.event_id"
		return r.fail(ErrMalformed, "missing required field")
	case seen&fData == 0:
		r.field = "event.data"
		return r.fail(ErrMalformed, "missing required field")
	}
	return nil
}

// eventData decodes serde's externally tagged enum: "cleared", or a map with
// one entry {"stored": {...}} / {"removed": {...}} / {"cleared": nil}.
func (r *reader) eventData(ev *ckf.RouterEvent, maxBlocks int) error {
	c, err := r.peek()
	if err != nil {
		return err
	}
	at := r.off
	if c >= 0xa0 && c <= 0xbf || c == mpStr8 || c == mpStr16 || c == mpStr32 {
		s, err := r.str()
		if err != nil {
			return err
		}
		if string(s) != "cleared" {
			r.off = at
			return r.fail(ErrMalformed, "unit variant "+quote(s)+", want \"cleared\"")
		}
		ev.Kind = ckf.EventCleared
		return nil
	}
	n, err := r.mapLen()
	if err != nil {
		return err
	}
	if n != 1 {
		r.off = at
		return r.fail(ErrMalformed, "enum map with "+itoa(n)+" entries, want 1")
	}
	k, err := r.key()
	if err != nil {
		return err
	}
	switch string(k) {
	case "stored":
		ev.Kind = ckf.EventStored
		r.field = "event.data.stored"
		return r.stored(ev, maxBlocks)
	case "removed":
		ev.Kind = ckf.EventRemoved
		r.field = "event.data.removed"
		return r.removed(ev, maxBlocks)
	case "cleared":
		ev.Kind = ckf.EventCleared
		r.field = "event.data.cleared"
		if !r.isNil() {
			return r.fail(ErrMalformed, "cleared carries no data")
		}
		return nil
	}
	r.off = at
	return r.fail(ErrMalformed, "unknown event variant "+quote(k))
}

func (r *reader) stored(ev *ckf.RouterEvent, maxBlocks int) error {
	n, err := r.mapLen()
	if err != nil {
		return err
	}
	var seen uint32
	const (
		fParent = 1 << iota
		fStart
		fBlocks
	)
	for range n {
		r.field = "event.data.stored"
		k, err := r.key()
		if err != nil {
			return err
		}
		switch string(k) {
		case "parent_hash":
			r.field = "event.data.stored.parent_hash"
			if err := r.dup(&seen, fParent); err != nil {
				return err
			}
			if r.isNil() {
				continue
			}
			if ev.ParentHash, err = r.uint(math.MaxUint64); err != nil {
				return err
			}
			ev.HasParent = true
		case "start_position":
			r.field = "event.data.stored.start_position"
			if err := r.dup(&seen, fStart); err != nil {
				return err
			}
			if r.isNil() {
				continue
			}
			v, err := r.uint(math.MaxUint32)
			if err != nil {
				return err
			}
			ev.StartPosition, ev.HasStartPosition = uint32(v), true
		case "blocks":
			r.field = "event.data.stored.blocks"
			if err := r.dup(&seen, fBlocks); err != nil {
				return err
			}
			m, err := r.arrayLen()
			if err != nil {
				return err
			}
			if err := r.blockLimit(m, maxBlocks); err != nil {
				return err
			}
			ev.Blocks = make([]ckf.StoredBlock, 0, min(m, r.remaining()/minBlockBytes+1))
			for range m {
				b, err := r.block()
				if err != nil {
					return err
				}
				ev.Blocks = append(ev.Blocks, b)
			}
		default:
			if err := r.skip(0); err != nil {
				return err
			}
		}
	}
	if seen&fBlocks == 0 {
		r.field = "event.data.stored.blocks"
		return r.fail(ErrMalformed, "missing required field")
	}
	return nil
}

func (r *reader) block() (ckf.StoredBlock, error) {
	var b ckf.StoredBlock
	r.field = "event.data.stored.blocks[]"
	n, err := r.mapLen()
	if err != nil {
		return b, err
	}
	var seen uint32
	const (
		fHash = 1 << iota
		fTokens
	)
	for range n {
		r.field = "event.data.stored.blocks[]"
		k, err := r.key()
		if err != nil {
			return b, err
		}
		switch string(k) {
		case "block_hash":
			r.field = "event.data.stored.blocks[].block_hash"
			if err := r.dup(&seen, fHash); err != nil {
				return b, err
			}
			if b.BlockHash, err = r.uint(math.MaxUint64); err != nil {
				return b, err
			}
		case "tokens_hash":
			r.field = "event.data.stored.blocks[].tokens_hash"
			if err := r.dup(&seen, fTokens); err != nil {
				return b, err
			}
			if b.TokensHash, err = r.uint(math.MaxUint64); err != nil {
				return b, err
			}
		default:
			if err := r.skip(0); err != nil {
				return b, err
			}
		}
	}
	switch {
	case seen&fHash == 0:
		r.field = "event.data.stored.blocks[].block_hash"
		return b, r.fail(ErrMalformed, "missing required field")
	case seen&fTokens == 0:
		r.field = "event.data.stored.blocks[].tokens_hash"
		return b, r.fail(ErrMalformed, "missing required field")
	}
	return b, nil
}

func (r *reader) removed(ev *ckf.RouterEvent, maxBlocks int) error {
	n, err := r.mapLen()
	if err != nil {
		return err
	}
	seen := false
	for range n {
		r.field = "event.data.removed"
		k, err := r.key()
		if err != nil {
			return err
		}
		if string(k) != "block_hashes" {
			if err := r.skip(0); err != nil {
				return err
			}
			continue
		}
		r.field = "event.data.removed.block_hashes"
		if seen {
			return r.fail(ErrMalformed, "duplicate field")
		}
		seen = true
		m, err := r.arrayLen()
		if err != nil {
			return err
		}
		if err := r.blockLimit(m, maxBlocks); err != nil {
			return err
		}
		ev.BlockHashes = make([]uint64, 0, min(m, r.remaining()))
		for range m {
			h, err := r.uint(math.MaxUint64)
			if err != nil {
				return err
			}
			ev.BlockHashes = append(ev.BlockHashes, h)
		}
	}
	if !seen {
		r.field = "event.data.removed.block_hashes"
		return r.fail(ErrMalformed, "missing required field")
	}
	return nil
}

func quote(b []byte) string {
	const max = 32
	if len(b) > max {
		return "\"" + string(b[:max]) + "…\""
	}
	return "\"" + string(b) + "\""
}

// AppendRouterEventMsgpack appends ev in the map form
// DecodeRouterEventMsgpack reads, with every field present (storage_tier as
// its name, parent_hash nil when absent; start_position only when set). It
// fails with [ErrInvalidEvent] for an unknown kind or storage tier.
func AppendRouterEventMsgpack(dst []byte, ev *ckf.RouterEvent) ([]byte, error) {
	if err := checkEvent(ev); err != nil {
		return dst, err
	}
	b := appendMapLen(dst, 3)
	b = appendStr(b, "worker_id")
	b = appendUint(b, ev.WorkerID)
	b = appendStr(b, "storage_tier")
	b = appendStr(b, ev.StorageTier.String())
	b = appendStr(b, "event")
	b = appendMapLen(b, 3)
	b = appendStr(b, "event_id")
	b = appendUint(b, ev.EventID)
	b = appendStr(b, "dp_rank")
	b = appendUint(b, uint64(ev.DPRank))
	b = appendStr(b, "data")
	switch ev.Kind {
	case ckf.EventCleared:
		return appendStr(b, "cleared"), nil
	case ckf.EventRemoved:
		b = appendMapLen(b, 1)
		b = appendStr(b, "removed")
		b = appendMapLen(b, 1)
		b = appendStr(b, "block_hashes")
		b = appendArrayLen(b, len(ev.BlockHashes))
		for _, h := range ev.BlockHashes {
			b = appendUint(b, h)
		}
		return b, nil
	}
	b = appendMapLen(b, 1)
	b = appendStr(b, "stored")
	fields := 2
	if ev.HasStartPosition {
		fields++
	}
	b = appendMapLen(b, fields)
	b = appendStr(b, "parent_hash")
	if ev.HasParent {
		b = appendUint(b, ev.ParentHash)
	} else {
		b = appendNil(b)
	}
	if ev.HasStartPosition {
		b = appendStr(b, "start_position")
		b = appendUint(b, uint64(ev.StartPosition))
	}
	b = appendStr(b, "blocks")
	b = appendArrayLen(b, len(ev.Blocks))
	for _, blk := range ev.Blocks {
		b = appendMapLen(b, 2)
		b = appendStr(b, "block_hash")
		b = appendUint(b, blk.BlockHash)
		b = appendStr(b, "tokens_hash")
		b = appendUint(b, blk.TokensHash)
	}
	return b, nil
}

// AppendRouterEventsMsgpack appends evs as a msgpack array (the batch form).
// On error it returns dst unchanged.
func AppendRouterEventsMsgpack(dst []byte, evs []ckf.RouterEvent) ([]byte, error) {
	b := appendArrayLen(dst, len(evs))
	var err error
	for i := range evs {
		if b, err = AppendRouterEventMsgpack(b, &evs[i]); err != nil {
			return dst, err
		}
	}
	return b, nil
}

func checkEvent(ev *ckf.RouterEvent) error {
	if ev.Kind < ckf.EventStored || ev.Kind > ckf.EventCleared {
		return eventError("unknown event kind %v", ev.Kind)
	}
	if _, ok := ckf.ParseStorageTier(ev.StorageTier.String()); !ok {
		return eventError("unknown storage tier %v", ev.StorageTier)
	}
	return nil
}
