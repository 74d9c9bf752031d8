package zmq

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"

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

// ParseMessage checks the frame layout of a published message.
func ParseMessage(frames [][]byte) (Message, error) {
	if len(frames) != 3 {
		return Message{}, malformed(ReasonFrames, nil, "%d frames, want 3 (topic, seq, payload)", len(frames))
	}
	if len(frames[1]) != 8 {
		return Message{}, malformed(ReasonFrames, nil, "sequence frame of %d bytes, want 8", len(frames[1]))
	}
	return Message{Topic: frames[0], Seq: int64(binary.BigEndian.Uint64(frames[1])), Payload: frames[2]}, nil
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
	Medium      string // "" when absent
	Locality    string // "" when absent
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
	dec     *msgpack.Decoder
}

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
// The returned batch owns its slices.
func (d *Decoder) DecodeBatch(payload []byte) (Batch, error) {
	d.payload = payload
	d.rd.Reset(payload)
	d.dec.Reset(&d.rd)
	var b Batch
	n, err := d.arrayLen()
	if err != nil || n < 2 {
		return Batch{}, malformed(ReasonBatch, err, "batch is not an array of at least 2 elements")
	}
	if b.Timestamp, err = d.number(); err != nil {
		return Batch{}, malformed(ReasonBatch, err, "ts is not a number")
	}
	ne, err := d.arrayLen()
	if err != nil || ne < 0 {
		return Batch{}, malformed(ReasonBatch, err, "events is not an array")
	}
	if ne > d.limits.MaxEvents {
		return Batch{}, malformed(ReasonLimit, nil, "%d events > limit %d", ne, d.limits.MaxEvents)
	}
	b.Events = make([]Event, 0, min(ne, len(payload)))
	for i := range ne {
		ev, err := d.event()
		if err != nil {
			var de *DecodeError
			if errors.As(err, &de) {
				de.Detail = fmt.Sprintf("event %d: %s", i, de.Detail)
			}
			return Batch{}, err
		}
		b.Events = append(b.Events, ev)
	}
	if n >= 3 {
		if d.isNil() {
			_ = d.dec.DecodeNil()
		} else {
			r, err := d.dec.DecodeInt64()
			if err != nil || r < 0 || r > math.MaxUint32 {
				return Batch{}, malformed(ReasonBatch, err, "data_parallel_rank is not nil or a uint32")
			}
			b.HasDPRank, b.DPRank = true, uint32(r)
		}
	}
	if n >= 4 {
		if d.isNil() {
			_ = d.dec.DecodeNil()
		} else {
			id, err := d.bytesOrString()
			if err != nil {
				return Batch{}, malformed(ReasonBatch, err, "publisher_id is not nil, bytes or a string")
			}
			b.PublisherID = id
		}
	}
	for range max(0, n-4) { // later batch fields are ignored
		if err := d.skip(0); err != nil {
			return Batch{}, err
		}
	}
	if d.rd.Len() != 0 {
		return Batch{}, malformed(ReasonTrailing, nil, "%d bytes after the batch", d.rd.Len())
	}
	return b, nil
}

func (d *Decoder) event() (Event, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return Event{}, malformed(ReasonEvent, err, "truncated")
	}
	switch {
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		return d.positional()
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		return d.named()
	}
	return Event{}, malformed(ReasonEvent, nil, "neither a tagged array nor a map (code %#x)", c)
}

// Positional layouts (msgspec array_like, tag first). Fields past the last
// known one are skipped; a short array ends early (defaults omitted).
//
//	BlockStored:  tag, block_hashes, parent_block_hash, token_ids, block_size,
//	              lora_id, medium, lora_name (older SGLang: a metadata map), …
//	BlockRemoved: tag, block_hashes, medium, …
func (d *Decoder) positional() (Event, error) {
	n, _ := d.arrayLen()
	if n < 1 {
		return Event{}, malformed(ReasonEvent, nil, "empty event array")
	}
	tag, err := d.stringBytes()
	if err != nil {
		return Event{}, malformed(ReasonEvent, err, "tag is not a string")
	}
	ev := Event{Type: eventTags[string(tag)]}
	if ev.Type == 0 {
		ev.Type = Unknown
	}
	fields := n - 1
	var order []string
	switch ev.Type {
	case BlockStored:
		if fields < 4 {
			return Event{}, malformed(ReasonRequired, nil, "BlockStored has %d fields, want at least 4", fields)
		}
		order = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"}
	case BlockRemoved:
		if fields < 1 {
			return Event{}, malformed(ReasonRequired, nil, "BlockRemoved has no block_hashes")
		}
		order = []string{"block_hashes", "medium"}
	}
	for i := range fields {
		if i < len(order) {
			if err := d.field(&ev, order[i], true); err != nil {
				return Event{}, err
			}
			continue
		}
		if err := d.skip(0); err != nil {
			return Event{}, err
		}
	}
	return ev, nil
}

// knownKeys are the map keys the decoder reads (a repeated one is malformed).
var knownKeys = []string{"type", "block_hashes", "parent_block_hash", "token_ids", "block_size",
	"lora_id", "medium", "lora_name", "locality"}

// named decodes a map event tagged under "type". Unknown keys are skipped.
func (d *Decoder) named() (Event, error) {
	n, _ := d.dec.DecodeMapLen()
	var ev Event
	var seen uint16 // bit i: knownKeys[i] was read
	for range n {
		kb, err := d.stringBytes()
		if err != nil {
			return Event{}, malformed(ReasonEvent, err, "map key is not a string")
		}
		i := knownKey(kb)
		if i < 0 {
			if err := d.skip(0); err != nil {
				return Event{}, err
			}
			continue
		}
		if seen&(1<<i) != 0 {
			return Event{}, malformed(ReasonField, nil, "duplicate key %q", kb)
		}
		seen |= 1 << i
		if k := knownKeys[i]; k != "type" {
			if err := d.field(&ev, k, false); err != nil {
				return Event{}, err
			}
			continue
		}
		tag, err := d.stringBytes()
		if err != nil {
			return Event{}, malformed(ReasonField, err, "type is not a string")
		}
		if ev.Type = eventTags[string(tag)]; ev.Type == 0 {
			ev.Type = Unknown
		}
	}
	switch ev.Type {
	case 0:
		return Event{}, malformed(ReasonRequired, nil, "map event without \"type\"")
	case BlockStored:
		for _, k := range []string{"block_hashes", "token_ids", "block_size"} {
			if seen&(1<<slices.Index(knownKeys, k)) == 0 {
				return Event{}, malformed(ReasonRequired, nil, "BlockStored without %s", k)
			}
		}
	case BlockRemoved:
		if seen&(1<<slices.Index(knownKeys, "block_hashes")) == 0 {
			return Event{}, malformed(ReasonRequired, nil, "BlockRemoved without block_hashes")
		}
	}
	return ev, nil
}

// field decodes one known field into ev, or skips an unknown one.
// positional marks the older array form, where position 7 may hold SGLang's
// metadata map instead of lora_name.
func (d *Decoder) field(ev *Event, name string, positional bool) error {
	var err error
	switch name {
	case "block_hashes":
		ev.BlockHashes, err = d.hashes()
	case "parent_block_hash":
		if d.isNil() {
			return d.dec.DecodeNil()
		}
		ev.HasParent = true
		ev.ParentHash, err = d.hash()
		if err != nil {
			return malformed(ReasonField, err, "parent_block_hash")
		}
	case "token_ids":
		ev.TokenIDs, err = d.tokens()
	case "block_size":
		var v int64
		v, err = d.dec.DecodeInt64()
		if err != nil || v < 1 || v > math.MaxInt32 {
			return malformed(ReasonField, err, "block_size is not a positive integer")
		}
		ev.BlockSize = int(v)
	case "lora_id":
		if d.isNil() {
			return d.dec.DecodeNil()
		}
		if _, err = d.dec.DecodeInt64(); err != nil {
			return malformed(ReasonField, err, "lora_id is not nil or an integer")
		}
	case "medium", "lora_name", "locality":
		if d.isNil() {
			return d.dec.DecodeNil()
		}
		if positional && name == "lora_name" && d.isMap() {
			return d.skip(0) // older SGLang: metadata map in this slot
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
	out := make([]uint64, 0, min(n, d.rd.Len()+1))
	for range n {
		h, err := d.hash()
		if err != nil {
			return nil, malformed(ReasonField, err, "block_hashes element")
		}
		out = append(out, h)
	}
	return out, nil
}

// hash reads a uint64, an int64 (its two's-complement bits) or a byte/str
// hash (its last 8 bytes, big-endian). Unsigned integers, what engines send by
// default, are read by wire's reader over the payload as token ids are; byte
// and string hashes are read into the decoder's buffer, not a new slice.
func (d *Decoder) hash() (uint64, error) {
	c, err := d.dec.PeekCode()
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

// tokens reads token_ids. The elements go through wire's msgpack reader
// over the payload bytes, not msgpack/v5's value-by-value path: token ids
// are most of an engine batch, and that path made this loop the source's
// largest cost (docs/RATIONALE.md, "Why does the ZMQ source read token ids
// with wire's reader?"). The array header and the rest of the batch still go
// through msgpack/v5.
func (d *Decoder) tokens() ([]uint32, error) {
	n, err := d.arrayLen()
	if err != nil || n < 0 {
		return nil, malformed(ReasonField, err, "token_ids is not an array")
	}
	if n > d.limits.MaxTokens {
		return nil, malformed(ReasonLimit, nil, "%d token ids > limit %d", n, d.limits.MaxTokens)
	}
	// The msgpack decoder reads d.rd without buffering (a *bytes.Reader is
	// an io.ByteScanner), so the reader's position is the decoder's.
	rest := d.payload[len(d.payload)-d.rd.Len():]
	out, used, err := appendTokenIDs(make([]uint32, 0, min(n, len(rest))), rest, n)
	if err != nil {
		return nil, err
	}
	_, _ = d.rd.Seek(int64(used), io.SeekCurrent)
	return out, nil
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
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, err
	}
	switch {
	case c == msgpcode.Float || c == msgpcode.Double:
		return d.dec.DecodeFloat64()
	case isInt(c):
		v, err := d.dec.DecodeInt64()
		return float64(v), err
	}
	return 0, fmt.Errorf("code %#x is not a number", c)
}

func (d *Decoder) bytesOrString() ([]byte, error) {
	c, err := d.dec.PeekCode()
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
var commonValues = []string{"GPU", "CPU", "CPU_TIER1", "CPU_TIER2", "STORAGE", "DISK", "LOCAL"}

func intern(b []byte) string {
	for _, v := range commonValues {
		if string(b) == v {
			return v
		}
	}
	return string(b)
}

// stringBytes reads a string as msgpack/v5's DecodeString does (a str or
// bin value; nil reads as empty) into the decoder's scratch buffer instead
// of a new string: tags and keys are read once per field of every event. The
// result is valid until the next call.
func (d *Decoder) stringBytes() ([]byte, error) {
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
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, err
	}
	if !(msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32 || c == msgpcode.Nil) {
		return 0, fmt.Errorf("code %#x is not an array", c)
	}
	return d.dec.DecodeArrayLen()
}

func (d *Decoder) isNil() bool {
	c, err := d.dec.PeekCode()
	return err == nil && c == msgpcode.Nil
}

func (d *Decoder) isMap() bool {
	c, err := d.dec.PeekCode()
	return err == nil && (msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32)
}

func isInt(c byte) bool {
	return msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Int64)
}

// skip passes over one ignored value, bounding the nesting (the library's
// Skip recurses without a limit).
func (d *Decoder) skip(depth int) error {
	if depth > maxSkipDepth {
		return malformed(ReasonNesting, nil, "ignored value nested deeper than %d", maxSkipDepth)
	}
	c, err := d.dec.PeekCode()
	if err != nil {
		return malformed(ReasonField, err, "truncated")
	}
	items := 0
	switch {
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		items, err = d.dec.DecodeArrayLen()
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		items, err = d.dec.DecodeMapLen()
		items *= 2
	default:
		if err := d.dec.Skip(); err != nil {
			return malformed(ReasonField, err, "truncated")
		}
		return nil
	}
	if err != nil {
		return malformed(ReasonField, err, "truncated")
	}
	for range items {
		if err := d.skip(depth + 1); err != nil {
			return err
		}
	}
	return nil
}
