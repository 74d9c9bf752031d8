package zmq

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"

	"github.com/ckfrelay/ckfrelay/internal/source"
	"github.com/ckfrelay/ckfrelay/wire"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// ErrMalformed is matched (errors.Is) by every [*DecodeError].
var ErrMalformed = errors.New("zmq source: malformed engine message")

// Reason classifies a rejected message; it is the label of the rejection
// metric and the "reason" of the rejection log line.
type Reason string

// Rejection reasons.
const (
	ReasonFrames   Reason = "frames"   // not 3 frames, or a sequence frame that is not 8 bytes
	ReasonBatch    Reason = "batch"    // the outer [ts, events, dp_rank?, publisher_id?] array
	ReasonEvent    Reason = "event"    // an event that is neither a tagged array nor a tagged map
	ReasonField    Reason = "field"    // a known field of the wrong type or out of range
	ReasonRequired Reason = "required" // a required field is missing
	ReasonLimit    Reason = "limit"    // more events, blocks or tokens than the limits allow
	ReasonTrailing Reason = "trailing" // bytes after the batch
	ReasonNesting  Reason = "nesting"  // an ignored value nested deeper than maxSkipDepth
	// ReasonSequence: a negative sequence. Publishers count from 0; the
	// only negative sequence of the protocol is the replay end marker (-1),
	// which never travels on the PUB socket. A publisher past 2^63-1 would
	// send 2^63 on, which reads as negative (docs/ingest.md, "Recovery").
	ReasonSequence Reason = "sequence"
)

// DecodeError is a typed rejection of one whole message: nothing of it is
// admitted.
type DecodeError struct {
	Reason Reason
	Detail string
	Err    error // the msgpack error underneath, if any
}

func (e *DecodeError) Error() string {
	s := fmt.Sprintf("zmq source: malformed engine message (%s): %s", e.Reason, e.Detail)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Is makes every DecodeError match [ErrMalformed].
func (e *DecodeError) Is(target error) bool { return target == ErrMalformed }

// Unwrap returns the msgpack error underneath.
func (e *DecodeError) Unwrap() error { return e.Err }

func malformed(r Reason, err error, format string, args ...any) *DecodeError {
	return &DecodeError{Reason: r, Detail: fmt.Sprintf(format, args...), Err: err}
}

// Message is one engine publication: the three ZMQ frames topic, sequence
// (8 bytes, big-endian, signed) and msgpack payload.
type Message struct {
	Topic   []byte
	Seq     int64
	Payload []byte
}

// ParseMessage checks the frame layout and the sequence of a published
// message: a negative sequence is rejected ([ReasonSequence]).
func ParseMessage(frames [][]byte) (Message, error) {
	if len(frames) != 3 {
		return Message{}, malformed(ReasonFrames, nil, "%d frames, want 3 (topic, seq, payload)", len(frames))
	}
	if len(frames[1]) != 8 {
		return Message{}, malformed(ReasonFrames, nil, "sequence frame of %d bytes, want 8", len(frames[1]))
	}
	seq := int64(binary.BigEndian.Uint64(frames[1]))
	if seq < 0 {
		return Message{}, malformed(ReasonSequence, nil, "sequence %d (%#x) is negative; sequences run from 0 to 2^63-1", seq, uint64(seq))
	}
	return Message{Topic: frames[0], Seq: seq, Payload: frames[2]}, nil
}

// EventType is the tag of an engine event.
type EventType uint8

// Engine event types.
const (
	BlockStored EventType = iota + 1
	BlockRemoved
	AllBlocksCleared
	// Unknown is an event whose tag this relay does not know: it is skipped
	// and counted (engines add event types; one must not stop a source).
	Unknown
)

var eventTags = map[string]EventType{"BlockStored": BlockStored, "BlockRemoved": BlockRemoved, "AllBlocksCleared": AllBlocksCleared}

// eventType returns the type of the tag b (Unknown for a tag this relay
// does not know): a switch, cheaper than the map for every event.
func eventType(b []byte) EventType {
	switch string(b) {
	case "BlockStored":
		return BlockStored
	case "BlockRemoved":
		return BlockRemoved
	case "AllBlocksCleared":
		return AllBlocksCleared
	}
	return Unknown
}

func (t EventType) String() string {
	for k, v := range eventTags {
		if v == t {
			return k
		}
	}
	return "Unknown"
}

// Event is one decoded engine event. Hashes are already reduced to uint64
// (the last 8 bytes, big-endian, of a byte-string hash).
type Event struct {
	Type        EventType
	BlockHashes []uint64
	HasParent   bool
	ParentHash  uint64
	TokenIDs    []uint32
	BlockSize   int
	LoRAName    string
	Medium      string // "" when absent (an empty string reads as absent)
	Locality    string // "" when absent
	// Ownership is the event's ownership domain when HasOwnership (vLLM's
	// ownership; absent means the framework's own cache, "kvcr" a
	// connector's), as Dynamo's KvEventOwnership reads it.
	Ownership    string
	HasOwnership bool

	// HasGroup and GroupIdx are the KV-cache group (hybrid models); Kind is
	// kv_cache_spec_kind ("" when absent).
	HasGroup bool
	GroupIdx uint32
	Kind     string
	// Namespace is the cache namespace (cache_salt) the event carries, from
	// whichever source the engine used (docs/ingest.md); "" when none.
	Namespace string
	// MM holds each block's multimodal hashes (nil: none in any block; a nil
	// element: none in that block), from block_mm_infos or extra_keys.
	MM [][]uint64
	// Eagle marks bigram token_ids, flattened: block i is hashed over
	// TokenIDs[i*block_size : (i+1)*block_size+1].
	Eagle bool
	// StringTokens marks token_ids holding a string (TensorRT-LLM's
	// EventTokenId = int | str): the event cannot be hashed and is dropped.
	StringTokens bool
}

// Batch is one decoded payload: [ts, events, dp_rank?, publisher_id?].
type Batch struct {
	Timestamp   float64
	Events      []Event
	HasDPRank   bool
	DPRank      uint32
	PublisherID []byte // nil when absent
}

// Limits bound what one batch may hold, so a hostile or broken publisher
// cannot make the relay allocate without bound.
type Limits struct {
	MaxEvents int // events per batch
	MaxBlocks int // block hashes per event
	MaxTokens int // token ids per event
}

// DefaultLimits are the relay's defaults (the HTTP ingest's event and block
// limits; tokens for 4096 blocks of 256).
var DefaultLimits = Limits{MaxEvents: 4096, MaxBlocks: 4096, MaxTokens: 4096 * 256}

// maxSkipDepth bounds the nesting of ignored values (extra_keys, metadata).
const maxSkipDepth = 32

// Decoder decodes engine payloads. It reuses its buffers across calls; it is
// not safe for concurrent use.
type Decoder struct {
	limits  Limits
	payload []byte // the payload being decoded; rd reads it
	rd      bytes.Reader
	str     []byte // stringBytes' buffer
	// The current batch's token ids and block hashes are cut from a few
	// shared chunks instead of one allocation per event (arena.go).
	tokenSpace arena[uint32]
	hashSpace  arena[uint64]
	dec        *msgpack.Decoder
	// Per event: what the namespace and multimodal hashes are derived from
	// once every field is read (a map may give lora_name after extra_keys).
	extra    [][]extraKey // extra_keys, one entry per block
	hasExtra bool
	mmInfos  [][]uint64 // block_mm_infos
	hasInfos bool
	salt     string // top-level cache_salt (map events)
	hasSalt  bool
}

// extraKey is one item of a block's extra_keys: a bare string, an
// (identifier, offset) tuple, or anything else (ignored).
type extraKey struct {
	kind uint8 // extraString, extraTuple, extraOther
	s    string
}

const (
	extraOther uint8 = iota
	extraString
	extraTuple
)

// NewDecoder returns a decoder enforcing limits (zero fields take
// [DefaultLimits]).
func NewDecoder(limits Limits) *Decoder {
	if limits.MaxEvents <= 0 {
		limits.MaxEvents = DefaultLimits.MaxEvents
	}
	if limits.MaxBlocks <= 0 {
		limits.MaxBlocks = DefaultLimits.MaxBlocks
	}
	if limits.MaxTokens <= 0 {
		limits.MaxTokens = DefaultLimits.MaxTokens
	}
	d := &Decoder{limits: limits}
	d.dec = msgpack.NewDecoder(&d.rd)
	return d
}

// DecodeBatch decodes one payload whole or rejects it with a [*DecodeError].
// The batch is an array [ts, events, data_parallel_rank?, publisher_id?, …]
// or a map with those keys (docs/ingest.md). The returned batch owns its
// slices.
func (d *Decoder) DecodeBatch(payload []byte) (Batch, error) {
	d.payload = payload
	d.rd.Reset(payload)
	d.tokenSpace.newBatch()
	d.hashSpace.newBatch()
	d.dec.Reset(&d.rd)
	var b Batch
	var err error
	if d.isMap() {
		b, err = d.batchMap()
	} else {
		b, err = d.batchArray()
	}
	if err != nil {
		return Batch{}, err
	}
	if d.rd.Len() != 0 {
		return Batch{}, malformed(ReasonTrailing, nil, "%d bytes after the batch", d.rd.Len())
	}
	return b, nil
}

func (d *Decoder) batchArray() (Batch, error) {
	var b Batch
	n, err := d.arrayLen()
	if err != nil || n < 2 {
		return Batch{}, malformed(ReasonBatch, err, "batch is neither a map nor an array of at least 2 elements")
	}
	if b.Timestamp, err = d.number(); err != nil {
		return Batch{}, malformed(ReasonBatch, err, "ts is not a number")
	}
	if b.Events, err = d.events(); err != nil {
		return Batch{}, err
	}
	if n >= 3 {
		if err := d.dpRank(&b); err != nil {
			return Batch{}, err
		}
	}
	if n >= 4 {
		if err := d.publisherID(&b); err != nil {
			return Batch{}, err
		}
	}
	for range max(0, n-4) { // later batch fields are ignored
		if err := d.skip(0); err != nil {
			return Batch{}, err
		}
	}
	return b, nil
}

// batchMap decodes the map form {"ts", "events", "data_parallel_rank",
// "publisher_id"} by field name ("dp_rank" is read as data_parallel_rank, as
// Dynamo's KvEventBatch aliases it); unknown keys are skipped.
func (d *Decoder) batchMap() (Batch, error) {
	var b Batch
	n, err := d.dec.DecodeMapLen()
	if err != nil {
		return Batch{}, malformed(ReasonBatch, err, "batch map")
	}
	var seen uint8
	for range n {
		k, err := d.stringBytes()
		if err != nil {
			return Batch{}, malformed(ReasonBatch, err, "batch map key is not a string")
		}
		bit := uint8(0)
		switch string(k) {
		case "ts":
			bit = 1
		case "events":
			bit = 2
		case "data_parallel_rank", "dp_rank":
			bit = 4
		case "publisher_id":
			bit = 8
		default:
			if err := d.skip(0); err != nil {
				return Batch{}, err
			}
			continue
		}
		if seen&bit != 0 {
			return Batch{}, malformed(ReasonBatch, nil, "duplicate batch key %q", k)
		}
		seen |= bit
		switch bit {
		case 1:
			if b.Timestamp, err = d.number(); err != nil {
				return Batch{}, malformed(ReasonBatch, err, "ts is not a number")
			}
		case 2:
			if b.Events, err = d.events(); err != nil {
				return Batch{}, err
			}
		case 4:
			err = d.dpRank(&b)
		case 8:
			err = d.publisherID(&b)
		}
		if err != nil {
			return Batch{}, err
		}
	}
	if seen&3 != 3 {
		return Batch{}, malformed(ReasonBatch, nil, "batch map without ts or events")
	}
	return b, nil
}

func (d *Decoder) events() ([]Event, error) {
	ne, err := d.arrayLen()
	if err != nil || ne < 0 {
		return nil, malformed(ReasonBatch, err, "events is not an array")
	}
	if ne > d.limits.MaxEvents {
		return nil, malformed(ReasonLimit, nil, "%d events > limit %d", ne, d.limits.MaxEvents)
	}
	evs := make([]Event, 0, min(ne, len(d.payload)))
	for i := range ne {
		// Decoded in place: an Event is large, and the slice's memory is
		// already zero.
		if len(evs) < cap(evs) {
			evs = evs[:len(evs)+1]
		} else {
			evs = append(evs, Event{})
		}
		err := d.event(&evs[i])
		if err != nil {
			var de *DecodeError
			if errors.As(err, &de) {
				de.Detail = fmt.Sprintf("event %d: %s", i, de.Detail)
			}
			return nil, err
		}
	}
	return evs, nil
}

func (d *Decoder) dpRank(b *Batch) error {
	if d.takeNil() {
		return nil
	}
	r, err := d.int64()
	if err != nil || r < 0 || r > math.MaxUint32 {
		return malformed(ReasonBatch, err, "data_parallel_rank is not nil or a uint32")
	}
	b.HasDPRank, b.DPRank = true, uint32(r)
	return nil
}

func (d *Decoder) publisherID(b *Batch) error {
	if d.takeNil() {
		return nil
	}
	id, err := d.bytesOrString()
	if err != nil {
		return malformed(ReasonBatch, err, "publisher_id is not nil, bytes or a string")
	}
	b.PublisherID = id
	return nil
}

func (d *Decoder) event(ev *Event) error {
	c, err := d.peekCode()
	if err != nil {
		return malformed(ReasonEvent, err, "truncated")
	}
	switch {
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		return d.positional(ev)
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		return d.named(ev)
	}
	return malformed(ReasonEvent, nil, "neither a tagged array nor a map (code %#x)", c)
}

// Positional layouts (msgspec array_like, tag first), read as Dynamo's
// deserializer reads them (lib/kv-router/src/zmq_wire/deserialize.rs, the
// newest stored version: the one with ownership and session_id). A short
// array ends early (defaults omitted); fields past the last known one are
// skipped.
//
//	BlockStored:      tag, block_hashes, parent_block_hash, token_ids,
//	                  block_size, lora_id, medium, lora_name, extra_keys,
//	                  then the trailing tail
//	BlockRemoved:     tag, block_hashes, medium, then the trailing tail
//	AllBlocksCleared: tag, ownership
//
// The trailing tail is up to five fields: group_idx, kv_cache_spec_kind,
// kv_cache_spec_sliding_window, locality, ownership (see [Decoder.trailing]).
// lora_name is nil or a string: SGLang's metadata map in that slot fails
// Dynamo's decode of the whole batch, and is malformed here too.
var (
	storedOrder = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
		"lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window", "locality", "ownership"}
	removedOrder = []string{"block_hashes", "medium", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window",
		"locality", "ownership"}
	clearedOrder = []string{"ownership"}
)

// trailingFrom is the index in storedOrder and removedOrder where the
// trailing tail starts.
var trailingFrom = map[EventType]int{BlockStored: 8, BlockRemoved: 2}

func (d *Decoder) positional(ev *Event) error {
	n, _ := d.arrayLen()
	if n < 1 {
		return malformed(ReasonEvent, nil, "empty event array")
	}
	tag, err := d.stringBytes()
	if err != nil {
		return malformed(ReasonEvent, err, "tag is not a string")
	}
	ev.Type = eventType(tag)
	d.beginEvent()
	fields := n - 1
	var order []string
	switch ev.Type {
	case BlockStored:
		if fields < 4 {
			return malformed(ReasonRequired, nil, "BlockStored has %d fields, want at least 4", fields)
		}
		order = storedOrder
	case BlockRemoved:
		if fields < 1 {
			return malformed(ReasonRequired, nil, "BlockRemoved has no block_hashes")
		}
		order = removedOrder
	case AllBlocksCleared:
		order = clearedOrder
	}
	head := len(order)
	if t, ok := trailingFrom[ev.Type]; ok {
		head = t
	}
	i := 0
	for ; i < fields && i < head; i++ {
		if err := d.field(ev, order[i]); err != nil {
			return err
		}
	}
	if head < len(order) && i < fields {
		n := min(fields-i, trailingFields)
		if err := d.trailing(ev, n); err != nil {
			return err
		}
		i += n
	}
	for ; i < fields; i++ {
		if err := d.skip(0); err != nil {
			return err
		}
	}
	return d.endEvent(ev)
}

// trailingFields is the length of the trailing tail.
const trailingFields = 5

// trailing reads the n (≤ trailingFields) positional fields after
// extra_keys (BlockStored) or medium (BlockRemoved) as Dynamo's
// deserializer does (deserialize.rs parse_block_stored_trailing,
// parse_common_trailing): each is nil, an unsigned 32-bit integer, a string,
// or anything else (ignored). With at least four fields whose kinds fit the
// fixed layout (integer, string, integer, string, string; nil anywhere) they
// are group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window, locality
// and ownership. Otherwise (the shorter tuples older vLLM versions sent,
// which omitted unused slots) they are read by kind: the first integer is
// group_idx, a second one the sliding window, a string kv_cache_spec_kind;
// locality and ownership are then absent.
func (d *Decoder) trailing(ev *Event, n int) error {
	type value struct {
		kind uint8 // 0 nil, 1 unsigned, 2 text, 3 other
		u    uint32
		s    string
	}
	var vals [trailingFields]value
	for i := range n {
		c, err := d.peekCode()
		switch {
		case err != nil:
			return malformed(ReasonEvent, err, "truncated")
		case c == msgpcode.Nil:
			d.consume(1)
		case isInt(c):
			v, err := d.int64()
			if err != nil {
				return malformed(ReasonField, err, "trailing field %d", i)
			}
			if v >= 0 && v <= math.MaxUint32 {
				vals[i] = value{kind: 1, u: uint32(v)}
			} else {
				vals[i].kind = 3
			}
		case msgpcode.IsString(c):
			b, err := d.stringBytes()
			if err != nil {
				return malformed(ReasonField, err, "trailing field %d", i)
			}
			vals[i] = value{kind: 2, s: intern(b)}
		default:
			if err := d.skip(0); err != nil {
				return err
			}
			vals[i].kind = 3
		}
	}
	fixed := n >= 4
	for i, want := range [trailingFields]uint8{1, 2, 1, 2, 2} {
		if vals[i].kind != 0 && vals[i].kind != want {
			fixed = false
		}
	}
	if fixed {
		if v := vals[0]; v.kind == 1 {
			ev.HasGroup, ev.GroupIdx = true, v.u
		}
		ev.Kind, ev.Locality = vals[1].s, vals[3].s
		if v := vals[4]; v.kind == 2 {
			ev.Ownership, ev.HasOwnership = v.s, true
		}
		return nil
	}
	window := false
	for _, v := range vals[:n] {
		switch {
		case v.kind == 1 && !ev.HasGroup:
			ev.HasGroup, ev.GroupIdx = true, v.u
		case v.kind == 1 && !window:
			window = true
		case v.kind == 2:
			ev.Kind = v.s
		}
	}
	return nil
}

// knownKeys are the map keys the decoder reads (a repeated one is malformed).
var knownKeys = []string{"type", "block_hashes", "parent_block_hash", "token_ids", "block_size",
	"lora_id", "medium", "lora_name", "locality", "extra_keys", "group_idx", "kv_cache_spec_kind",
	"kv_cache_spec_sliding_window", "cache_salt", "block_mm_infos", "ownership"}

// named decodes a map event tagged under "type". Unknown keys are skipped.
func (d *Decoder) named(ev *Event) error {
	n, _ := d.dec.DecodeMapLen()
	d.beginEvent()
	var seen uint32 // bit i: knownKeys[i] was read
	for range n {
		kb, err := d.stringBytes()
		if err != nil {
			return malformed(ReasonEvent, err, "map key is not a string")
		}
		i := knownKey(kb)
		if i < 0 {
			if err := d.skip(0); err != nil {
				return err
			}
			continue
		}
		if seen&(1<<i) != 0 {
			return malformed(ReasonField, nil, "duplicate key %q", kb)
		}
		seen |= 1 << i
		if k := knownKeys[i]; k != "type" {
			if err := d.field(ev, k); err != nil {
				return err
			}
			continue
		}
		tag, err := d.stringBytes()
		if err != nil {
			return malformed(ReasonField, err, "type is not a string")
		}
		ev.Type = eventType(tag)
	}
	switch ev.Type {
	case 0:
		return malformed(ReasonRequired, nil, "map event without \"type\"")
	case BlockStored:
		for _, k := range []string{"block_hashes", "token_ids", "block_size"} {
			if seen&(1<<slices.Index(knownKeys, k)) == 0 {
				return malformed(ReasonRequired, nil, "BlockStored without %s", k)
			}
		}
	case BlockRemoved:
		if seen&(1<<slices.Index(knownKeys, "block_hashes")) == 0 {
			return malformed(ReasonRequired, nil, "BlockRemoved without block_hashes")
		}
	}
	return d.endEvent(ev)
}

func (d *Decoder) beginEvent() {
	d.extra, d.hasExtra = d.extra[:0], false
	d.mmInfos, d.hasInfos = nil, false
	d.salt, d.hasSalt = "", false
}

// endEvent derives what depends on several fields, as Dynamo's
// deserializer does (lib/kv-router/src/zmq_wire/deserialize.rs,
// extra_keys.rs): the namespace is cache_salt when the event has one (an
// empty one is none), else a "dynamo-cache-salt:"-tagged string in the first
// block's extra_keys (an item equal to lora_name is passed over once); the
// multimodal hashes are block_mm_infos when present, else the extra_keys
// items in Dynamo's marker form.
func (d *Decoder) endEvent(ev *Event) error {
	if ev.Type != BlockStored {
		return nil
	}
	switch {
	case d.hasSalt:
		ev.Namespace = d.salt
	case d.hasExtra && len(d.extra) > 0:
		ev.Namespace = extraNamespace(d.extra[0], ev.LoRAName)
	}
	switch {
	case d.hasInfos:
		ev.MM = d.mmInfos
	case d.hasExtra:
		ev.MM = extraMM(d.extra)
	}
	return nil
}

// field decodes one known field into ev, or skips an unknown one.
func (d *Decoder) field(ev *Event, name string) error {
	var err error
	switch name {
	case "block_hashes":
		ev.BlockHashes, err = d.hashes()
	case "parent_block_hash":
		if d.takeNil() {
			return nil
		}
		ev.HasParent = true
		ev.ParentHash, err = d.hash()
		if err != nil {
			return malformed(ReasonField, err, "parent_block_hash")
		}
	case "token_ids":
		err = d.tokens(ev)
	case "block_size":
		var v int64
		v, err = d.int64()
		if err != nil || v < 1 || v > math.MaxInt32 {
			return malformed(ReasonField, err, "block_size is not a positive integer")
		}
		ev.BlockSize = int(v)
	case "lora_id":
		if d.takeNil() {
			return nil
		}
		if _, err = d.int64(); err != nil {
			return malformed(ReasonField, err, "lora_id is not nil or an integer")
		}
	case "group_idx", "kv_cache_spec_sliding_window":
		if d.takeNil() {
			return nil
		}
		v, err := d.int64()
		if err != nil || v < 0 || v > math.MaxUint32 {
			return malformed(ReasonField, err, "%s is not nil or a uint32", name)
		}
		if name == "group_idx" {
			ev.HasGroup, ev.GroupIdx = true, uint32(v)
		}
	case "extra_keys":
		return d.extraKeys()
	case "block_mm_infos":
		return d.blockMMInfos()
	case "cache_salt":
		if d.takeNil() {
			return nil
		}
		b, err := d.stringBytes()
		if err != nil {
			return malformed(ReasonField, err, "cache_salt is not nil or a string")
		}
		d.salt, d.hasSalt = string(b), true
	case "medium", "lora_name", "locality", "kv_cache_spec_kind", "ownership":
		if d.takeNil() {
			return nil
		}
		var b []byte
		if b, err = d.stringBytes(); err != nil {
			return malformed(ReasonField, err, "%s is not nil or a string", name)
		}
		s := intern(b)
		switch name {
		case "medium":
			ev.Medium = s
		case "lora_name":
			ev.LoRAName = s
		case "kv_cache_spec_kind":
			ev.Kind = s
		case "ownership":
			ev.Ownership, ev.HasOwnership = s, true
		default:
			ev.Locality = s
		}
	default:
		return d.skip(0)
	}
	return err
}

func (d *Decoder) hashes() ([]uint64, error) {
	n, err := d.arrayLen()
	if err != nil || n < 0 {
		return nil, malformed(ReasonField, err, "block_hashes is not an array")
	}
	if n > d.limits.MaxBlocks {
		return nil, malformed(ReasonLimit, nil, "%d block hashes > limit %d", n, d.limits.MaxBlocks)
	}
	out := d.hashSpace.take(min(n, d.rd.Len()+1), d.rd.Len())
	for range n {
		h, err := d.hash()
		if err != nil {
			return nil, malformed(ReasonField, err, "block_hashes element")
		}
		out = append(out, h)
	}
	d.hashSpace.commit(len(out))
	return out, nil
}

// hash reads a uint64, an int64 (its two's-complement bits) or a byte/str
// hash (its last 8 bytes, big-endian). Unsigned integers, what engines send by
// default, are read by wire's reader over the payload as token ids are; byte
// and string hashes are read into the decoder's buffer, not a new slice.
func (d *Decoder) hash() (uint64, error) {
	if r := d.rest(); len(r) > 0 { // an unsigned integer, what engines send, read here directly
		switch c := r[0]; {
		case c <= msgpcode.PosFixedNumHigh:
			d.consume(1)
			return uint64(c), nil
		case c == msgpcode.Uint64 && len(r) >= 9:
			d.consume(9)
			return binary.BigEndian.Uint64(r[1:]), nil
		case c == msgpcode.Uint32 && len(r) >= 5:
			d.consume(5)
			return uint64(binary.BigEndian.Uint32(r[1:])), nil
		}
	}
	c, err := d.peekCode()
	if err != nil {
		return 0, err
	}
	switch {
	case c <= msgpcode.PosFixedNumHigh || c >= msgpcode.Uint8 && c <= msgpcode.Uint64:
		rest := d.payload[len(d.payload)-d.rd.Len():]
		wd := wire.NewDecoder(rest)
		v, err := wd.Uint(math.MaxUint64, "block_hashes")
		if err != nil {
			return 0, err
		}
		_, _ = d.rd.Seek(int64(wd.Offset()), io.SeekCurrent)
		return v, nil
	case isInt(c):
		return d.dec.DecodeUint64()
	case !msgpcode.IsBin(c) && !msgpcode.IsString(c):
		return 0, fmt.Errorf("code %#x is neither an integer, bytes nor a string", c)
	}
	b, err := d.stringBytes()
	if err != nil {
		return 0, err
	}
	if len(b) == 0 {
		return 0, errors.New("empty hash")
	}
	var w [8]byte
	copy(w[max(0, 8-len(b)):], b[max(0, len(b)-8):])
	return binary.BigEndian.Uint64(w[:]), nil
}

// tokens reads token_ids into ev. The elements go through wire's msgpack
// reader over the payload bytes, not msgpack/v5's value-by-value path: token
// ids are most of an engine batch, and that path made this loop the source's
// largest cost (docs/RATIONALE.md, "Why does the ZMQ source read token ids
// with wire's reader?"). The array header and the rest of the batch still go
// through msgpack/v5. Bigram token_ids (Eagle: [[a, b], …]) are flattened as
// Dynamo does (each pair's first element, then the last pair's second); a
// string element (TensorRT-LLM) marks the event instead of failing the batch.
func (d *Decoder) tokens(ev *Event) error {
	n, err := d.arrayLen()
	if err != nil || n < 0 {
		return malformed(ReasonField, err, "token_ids is not an array")
	}
	if n > d.limits.MaxTokens {
		return malformed(ReasonLimit, nil, "%d token ids > limit %d", n, d.limits.MaxTokens)
	}
	if n > 0 {
		c, err := d.peekCode()
		if err != nil {
			return malformed(ReasonField, err, "token_ids truncated")
		}
		switch {
		case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
			return d.bigrams(ev, n)
		case msgpcode.IsString(c):
			ev.StringTokens = true
			for range n {
				if err := d.skip(1); err != nil {
					return err
				}
			}
			return nil
		}
	}
	rest := d.rest()
	out, used := fastTokenIDs(d.tokenSpace.take(min(n, len(rest)), len(rest)), rest, n)
	if len(out) < n { // a form the fast loop does not take: the rest through wire's reader
		var more int
		var err error
		out, more, err = appendTokenIDs(out, rest[used:], n-len(out))
		if err != nil {
			if isStringAhead(rest, n) {
				ev.StringTokens = true
				for range n {
					if err := d.skip(1); err != nil {
						return err
					}
				}
				return nil
			}
			return err
		}
		used += more
	}
	d.consume(used)
	d.tokenSpace.commit(len(out))
	ev.TokenIDs = out
	return nil
}

// fastTokenIDs appends to dst the leading run of the n msgpack values at the
// start of b that are unsigned integers of at most 32 bits in their shortest
// forms (positive fixint, uint8, uint16, uint32: what engines send), and
// returns how many bytes they took. It stops at the first other value; the
// caller reads the rest with [appendTokenIDs], which takes every integer
// encoding in uint32 range and fails on anything else. Token ids are most of
// an engine batch: this loop is the source's hottest.
func fastTokenIDs(dst []uint32, b []byte, n int) ([]uint32, int) {
	off := 0
	for range n {
		if off >= len(b) {
			break
		}
		switch c := b[off]; {
		case c <= msgpcode.PosFixedNumHigh:
			dst = append(dst, uint32(c))
			off++
		case c == msgpcode.Uint32 && off+5 <= len(b):
			dst = append(dst, binary.BigEndian.Uint32(b[off+1:]))
			off += 5
		case c == msgpcode.Uint16 && off+3 <= len(b):
			dst = append(dst, uint32(binary.BigEndian.Uint16(b[off+1:])))
			off += 3
		case c == msgpcode.Uint8 && off+2 <= len(b):
			dst = append(dst, uint32(b[off+1]))
			off += 2
		default:
			return dst, off
		}
	}
	return dst, off
}

// isStringAhead reports whether one of the n values at the start of b is a
// string, reading only as far as it can (a mixed int/str token list).
func isStringAhead(b []byte, n int) bool {
	wd := wire.NewDecoder(b)
	for range n {
		if wd.Offset() < len(b) && msgpcode.IsString(b[wd.Offset()]) {
			return true
		}
		if _, err := wd.Uint(math.MaxUint32, "token_ids"); err != nil {
			return false
		}
	}
	return false
}

// bigrams reads n [first, second] token pairs and flattens them.
func (d *Decoder) bigrams(ev *Event, n int) error {
	if 2*n > d.limits.MaxTokens+2 {
		return malformed(ReasonLimit, nil, "%d token pairs > limit", n)
	}
	out := make([]uint32, 0, min(n+1, d.rd.Len()))
	var last uint32
	for range n {
		if m, err := d.arrayLen(); err != nil || m != 2 {
			return malformed(ReasonField, err, "token_ids mixes single ids and pairs, or a pair is not 2 ids")
		}
		rest := d.payload[len(d.payload)-d.rd.Len():]
		var two [2]uint32
		pair, used, err := appendTokenIDs(two[:0], rest, 2)
		if err != nil {
			return err
		}
		_, _ = d.rd.Seek(int64(used), io.SeekCurrent)
		out = append(out, pair[0])
		last = pair[1]
	}
	ev.TokenIDs, ev.Eagle = append(out, last), true
	return nil
}

// appendTokenIDs appends the n msgpack integers at the start of b to dst and
// returns how many bytes they took. Each must be an integer in uint32 range,
// in any msgpack integer encoding.
func appendTokenIDs(dst []uint32, b []byte, n int) ([]uint32, int, error) {
	wd := wire.NewDecoder(b)
	for range n {
		v, err := wd.Uint(math.MaxUint32, "token_ids")
		if err != nil {
			return nil, 0, malformed(ReasonField, err, "token id is not an integer in uint32 range")
		}
		dst = append(dst, uint32(v))
	}
	return dst, wd.Offset(), nil
}

func (d *Decoder) number() (float64, error) {
	c, err := d.peekCode()
	if err != nil {
		return 0, err
	}
	switch {
	case c == msgpcode.Float || c == msgpcode.Double:
		return d.dec.DecodeFloat64()
	case isInt(c):
		v, err := d.int64()
		return float64(v), err
	}
	return 0, fmt.Errorf("code %#x is not a number", c)
}

func (d *Decoder) bytesOrString() ([]byte, error) {
	c, err := d.peekCode()
	if err != nil {
		return nil, err
	}
	if !msgpcode.IsBin(c) && !msgpcode.IsString(c) {
		return nil, fmt.Errorf("code %#x is neither bytes nor a string", c)
	}
	if msgpcode.IsString(c) {
		s, err := d.dec.DecodeString()
		return []byte(s), err
	}
	return d.dec.DecodeBytes()
}

// knownKey returns k's index in knownKeys, or -1.
func knownKey(k []byte) int {
	for i, known := range knownKeys {
		if string(k) == known {
			return i
		}
	}
	return -1
}

// commonValues are the string field values engines send on every event; a
// decoded value equal to one shares its string instead of allocating.
var commonValues = []string{"GPU", "CPU", "CPU_TIER1", "CPU_TIER2", "STORAGE", "DISK", "LOCAL",
	"full_attention", "mla_attention", "sink_full_attention", "sliding_window", "mamba"}

func intern(b []byte) string {
	for _, v := range commonValues {
		if string(b) == v {
			return v
		}
	}
	return string(b)
}

// stringBytes reads a string as msgpack/v5's DecodeString does (a str or
// bin value; nil reads as empty): a fixstr, what tags, keys and field values
// are, as a sub-slice of the payload; any other into the decoder's scratch
// buffer instead of a new string. The result is valid until the next call
// (callers copy what they keep) and must not be written to.
func (d *Decoder) stringBytes() ([]byte, error) {
	if r := d.rest(); len(r) > 0 && msgpcode.IsFixedString(r[0]) {
		if n := int(r[0] & msgpcode.FixedStrMask); 1+n <= len(r) {
			d.consume(1 + n)
			return r[1 : 1+n : 1+n], nil
		}
	}
	n, err := d.dec.DecodeBytesLen()
	if err != nil {
		return nil, err
	}
	if n > d.rd.Len() {
		return nil, io.ErrUnexpectedEOF // before growing the buffer to a hostile length
	}
	d.str = slices.Grow(d.str[:0], max(n, 0))[:max(n, 0)]
	if err := d.dec.ReadFull(d.str); err != nil {
		return nil, err
	}
	return d.str, nil
}

func (d *Decoder) arrayLen() (int, error) {
	if r := d.rest(); len(r) > 0 && msgpcode.IsFixedArray(r[0]) {
		d.consume(1)
		return int(r[0] & msgpcode.FixedArrayMask), nil
	}
	c, err := d.peekCode()
	if err != nil {
		return 0, err
	}
	if !(msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32 || c == msgpcode.Nil) {
		return 0, fmt.Errorf("code %#x is not an array", c)
	}
	return d.dec.DecodeArrayLen()
}

// The hot path reads the payload directly, not through msgpack/v5's
// byte-by-byte interface calls: the msgpack decoder reads d.rd without
// buffering (a *bytes.Reader is an io.ByteScanner), so the reader's
// position is the decoder's, and consume moves both. The library still reads
// every form the fast paths do not take, with its own errors.

// rest returns the payload not read yet.
func (d *Decoder) rest() []byte { return d.payload[len(d.payload)-d.rd.Len():] }

// consume moves the read position n bytes on (n ≤ len(d.rest())).
func (d *Decoder) consume(n int) { _, _ = d.rd.Seek(int64(n), io.SeekCurrent) }

// peekCode returns the next value's type byte without consuming it.
func (d *Decoder) peekCode() (byte, error) {
	if r := d.rest(); len(r) > 0 {
		return r[0], nil
	}
	return d.dec.PeekCode() // its end-of-input error
}

// takeNil consumes a nil and reports true, or consumes nothing.
func (d *Decoder) takeNil() bool {
	if r := d.rest(); len(r) > 0 && r[0] == msgpcode.Nil {
		d.consume(1)
		return true
	}
	return false
}

// int64 reads an integer as msgpack/v5's DecodeInt64 does.
func (d *Decoder) int64() (int64, error) {
	if r := d.rest(); len(r) > 0 && r[0] <= msgpcode.PosFixedNumHigh {
		d.consume(1)
		return int64(r[0]), nil
	}
	return d.dec.DecodeInt64()
}

func (d *Decoder) isMap() bool {
	c, err := d.peekCode()
	return err == nil && (msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32)
}

func isInt(c byte) bool {
	return msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Int64)
}

// skip passes over one ignored value found at nesting level depth,
// bounding the nesting (source.SkipMsgpack: the library's Skip recurses
// without a limit).
func (d *Decoder) skip(depth int) error {
	switch err := source.SkipMsgpack(d.dec, maxSkipDepth-depth); {
	case errors.Is(err, source.ErrNestedTooDeep):
		return malformed(ReasonNesting, nil, "ignored value nested deeper than %d", maxSkipDepth)
	case err != nil:
		return malformed(ReasonField, err, "truncated")
	}
	return nil
}
