package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strconv"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// BatchLimits bound what a batch decoder accepts. A zero field means no
// limit.
type BatchLimits struct {
	// MaxEvents bounds the events in one batch.
	MaxEvents int
	// MaxBlocksPerEvent bounds the blocks of a Stored event and the hashes
	// of a Removed one. The JSON decoder applies it to every array inside an
	// event (unknown fields included), so no array can grow past it.
	MaxBlocksPerEvent int
}

// JSON shapes of Dynamo's RouterEvent (serde derive, externally tagged
// snake_case enum). Pointers tell an absent or null field from a zero value.
type jsonRouterEvent struct {
	WorkerID    *uint64      `json:"worker_id"`
	StorageTier *string      `json:"storage_tier"`
	Event       *jsonKVEvent `json:"event"`
}

type jsonKVEvent struct {
	EventID *uint64        `json:"event_id"`
	DPRank  *uint32        `json:"dp_rank"`
	Data    *jsonEventData `json:"data"`
}

type jsonEventData struct {
	kind    ckf.EventKind
	stored  jsonStored
	removed jsonRemoved
}

type jsonStored struct {
	ParentHash    *uint64      `json:"parent_hash"`
	StartPosition *uint32      `json:"start_position"`
	Blocks        *[]jsonBlock `json:"blocks"`
}

type jsonBlock struct {
	BlockHash  *uint64 `json:"block_hash"`
	TokensHash *uint64 `json:"tokens_hash"`
}

type jsonRemoved struct {
	BlockHashes *[]jsonHash `json:"block_hashes"`
}

// jsonHash is a u64 array element: unlike a plain uint64 it rejects null
// (encoding/json would leave a zero in its place).
type jsonHash uint64

func (h *jsonHash) UnmarshalJSON(b []byte) error {
	v, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil {
		return &fieldError{"event.data.removed.block_hashes[]", "JSON " + quote(b) + " is not a u64"}
	}
	*h = jsonHash(v)
	return nil
}

// fieldError is returned from UnmarshalJSON and the conversion below; it is
// turned into a *DecodeError with the field path.
type fieldError struct {
	field, detail string
}

func (e *fieldError) Error() string { return e.field + ": " + e.detail }

// UnmarshalJSON accepts "cleared", {"cleared": null}, {"stored": {...}} and
// {"removed": {...}}.
func (d *jsonEventData) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		if s != "cleared" {
			return &fieldError{"event.data", "unit variant " + strconv.Quote(s) + ", want \"cleared\""}
		}
		d.kind = ckf.EventCleared
		return nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	if len(m) != 1 {
		return &fieldError{"event.data", "enum object with " + strconv.Itoa(len(m)) + " entries, want 1"}
	}
	for k, v := range m {
		switch k {
		case "stored":
			d.kind = ckf.EventStored
			if err := json.Unmarshal(v, &d.stored); err != nil {
				return err
			}
			if bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
				return &fieldError{"event.data.stored", "null, want an object"}
			}
		case "removed":
			d.kind = ckf.EventRemoved
			if err := json.Unmarshal(v, &d.removed); err != nil {
				return err
			}
			if bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
				return &fieldError{"event.data.removed", "null, want an object"}
			}
		case "cleared":
			d.kind = ckf.EventCleared
			if !bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
				return &fieldError{"event.data.cleared", "cleared carries no data"}
			}
		default:
			return &fieldError{"event.data", "unknown event variant " + strconv.Quote(k)}
		}
	}
	return nil
}

func (j *jsonRouterEvent) convert() (ckf.RouterEvent, error) {
	var ev ckf.RouterEvent
	if j.WorkerID == nil {
		return ev, &fieldError{"worker_id", "missing required field"}
	}
	ev.WorkerID = *j.WorkerID
	if j.StorageTier != nil {
		t, ok := ckf.ParseStorageTier(*j.StorageTier)
		if !ok {
			return ev, &fieldError{"storage_tier", "unknown storage tier " + strconv.Quote(*j.StorageTier)}
		}
		ev.StorageTier = t
	}
	e := j.Event
	switch {
	case e == nil:
		return ev, &fieldError{"event", "missing required field"}
	case e.EventID == nil:
		return ev, &fieldError{"event.event_id", "missing required field"}
	case e.Data == nil:
		return ev, &fieldError{"event.data", "missing required field"}
	}
	ev.EventID = *e.EventID
	if e.DPRank != nil {
		ev.DPRank = *e.DPRank
	}
	ev.Kind = e.Data.kind
	switch ev.Kind {
	case ckf.EventStored:
		s := &e.Data.stored
		if s.ParentHash != nil {
			ev.HasParent, ev.ParentHash = true, *s.ParentHash
		}
		if s.StartPosition != nil {
			ev.HasStartPosition, ev.StartPosition = true, *s.StartPosition
		}
		if s.Blocks == nil {
			return ev, &fieldError{"event.data.stored.blocks", "missing required field"}
		}
		ev.Blocks = make([]ckf.StoredBlock, len(*s.Blocks))
		for i, b := range *s.Blocks {
			switch {
			case b.BlockHash == nil:
				return ev, &fieldError{"event.data.stored.blocks[" + strconv.Itoa(i) + "].block_hash", "missing required field"}
			case b.TokensHash == nil:
				return ev, &fieldError{"event.data.stored.blocks[" + strconv.Itoa(i) + "].tokens_hash", "missing required field"}
			}
			ev.Blocks[i] = ckf.StoredBlock{BlockHash: *b.BlockHash, TokensHash: *b.TokensHash}
		}
	case ckf.EventRemoved:
		if e.Data.removed.BlockHashes == nil {
			return ev, &fieldError{"event.data.removed.block_hashes", "missing required field"}
		}
		hs := *e.Data.removed.BlockHashes
		ev.BlockHashes = make([]uint64, len(hs))
		for i, h := range hs {
			ev.BlockHashes[i] = uint64(h)
		}
	}
	return ev, nil
}

// decodeJSON decodes exactly one JSON value from data into v, mapping every
// failure to a *DecodeError.
func decodeJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	err := dec.Decode(v)
	if err == nil {
		off := int(dec.InputOffset())
		rest := bytes.TrimLeft(data[off:], " \t\r\n")
		if len(rest) != 0 {
			return &DecodeError{Kind: ErrTrailingBytes, Offset: len(data) - len(rest), Detail: strconv.Itoa(len(rest)) + " bytes after the value"}
		}
		return nil
	}
	return jsonError(err, int(dec.InputOffset()))
}

func jsonError(err error, at int) error {
	var fe *fieldError
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return &DecodeError{Kind: ErrTruncated, Offset: at, Detail: "input ended inside the JSON value"}
	case errors.As(err, &fe):
		return &DecodeError{Kind: ErrMalformed, Offset: at, Field: fe.field, Detail: fe.detail}
	case errors.As(err, &se):
		return &DecodeError{Kind: ErrMalformed, Offset: int(se.Offset), Detail: se.Error()}
	case errors.As(err, &te):
		return &DecodeError{Kind: ErrMalformed, Offset: int(te.Offset), Field: te.Field, Detail: "JSON " + te.Value + " where " + jsonKind(te.Type) + " belongs"}
	}
	return &DecodeError{Kind: ErrMalformed, Offset: at, Detail: err.Error()}
}

// jsonKind names the JSON value a Go type decodes from, so that error texts
// speak of the input ("an array of events") rather than of Go types.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an unsigned integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	}
	return "another value"
}

// DecodeRouterEventJSON decodes one Dynamo RouterEvent in its serde JSON form
// into a [ckf.RouterEvent]. The accepted shape is in docs/wire.md: absent
// (or null) optional fields take Dynamo's defaults (storage_tier "device",
// dp_rank 0, parent_hash and start_position none), unknown fields are
// ignored, integers must be non-negative JSON integers within their field's
// range (u64 exactly, no exponent or fraction). Errors are [*DecodeError]s;
// JSON offsets are best effort (field-level errors point at the end of the
// event). The result's slices are freshly allocated.
func DecodeRouterEventJSON(data []byte) (ckf.RouterEvent, error) {
	var j jsonRouterEvent
	if err := decodeJSON(data, &j); err != nil {
		return ckf.RouterEvent{}, err
	}
	ev, err := j.convert()
	if err != nil {
		return ckf.RouterEvent{}, jsonError(err, len(data))
	}
	return ev, nil
}

// DecodeRouterEventsJSON decodes a JSON array of RouterEvents (the batch
// form) and appends them to dst. On error it returns dst unchanged. It
// applies no batch limits: decode untrusted input with
// [DecodeRouterEventsJSONLimited].
func DecodeRouterEventsJSON(data []byte, dst []ckf.RouterEvent) ([]ckf.RouterEvent, error) {
	return DecodeRouterEventsJSONLimited(data, dst, BatchLimits{})
}

// DecodeRouterEventsJSONLimited is [DecodeRouterEventsJSON] under lim. The
// limits apply while decoding, not after: the array is walked one event at a
// time, an event's extent is scanned (without allocating) before it is
// decoded, and the first event past lim.MaxEvents, or the first array inside
// an event with more than lim.MaxBlocksPerEvent elements, stops the decode
// with an [ErrLimitExceeded] error. So a hostile batch costs at most about
// lim's worth of decoded events however large the input is.
func DecodeRouterEventsJSONLimited(data []byte, dst []ckf.RouterEvent, lim BatchLimits) ([]ckf.RouterEvent, error) {
	i := skipJSONSpace(data, 0)
	switch {
	case i == len(data):
		return dst, &DecodeError{Kind: ErrTruncated, Offset: i, Detail: "input ended before the JSON value"}
	case bytes.HasPrefix(data[i:], []byte("null")) && skipJSONSpace(data, i+4) == len(data):
		return dst, &DecodeError{Kind: ErrMalformed, Field: "events", Detail: "null, want an array"}
	case data[i] != '[':
		// Not an array: let encoding/json say what it is.
		var js []jsonRouterEvent
		if err := decodeJSON(data, &js); err != nil {
			return dst, err
		}
		return dst, &DecodeError{Kind: ErrMalformed, Offset: i, Field: "events", Detail: "want an array"}
	}
	// A fresh backing array: dst's elements are never overwritten on error.
	out := dst[:len(dst):len(dst)]
	i = skipJSONSpace(data, i+1)
	if i < len(data) && data[i] == ']' {
		i++
	} else {
		for n := 0; ; n++ {
			if i == len(data) {
				return dst, &DecodeError{Kind: ErrTruncated, Offset: i, Detail: "input ended inside the events array"}
			}
			if lim.MaxEvents > 0 && n == lim.MaxEvents {
				return dst, &DecodeError{Kind: ErrLimitExceeded, Offset: i, Field: "events",
					Detail: "more than " + strconv.Itoa(lim.MaxEvents) + " events in one batch"}
			}
			end, err := spanJSON(data, i, lim.MaxBlocksPerEvent)
			if err != nil {
				if de, ok := err.(*DecodeError); ok {
					de.Field = "[" + strconv.Itoa(n) + "]" + de.Field
				}
				return dst, err
			}
			var j jsonRouterEvent
			if err := json.Unmarshal(data[i:end], &j); err != nil {
				return dst, atEvent(jsonError(err, end-i), n, i)
			}
			ev, err := j.convert()
			if err != nil {
				return dst, atEvent(jsonError(err, end-i), n, i)
			}
			out = append(out, ev)
			i = skipJSONSpace(data, end)
			if i < len(data) && data[i] == ',' {
				i = skipJSONSpace(data, i+1)
				continue
			}
			if i < len(data) && data[i] == ']' {
				i++
				break
			}
			if i == len(data) {
				return dst, &DecodeError{Kind: ErrTruncated, Offset: i, Detail: "input ended inside the events array"}
			}
			return dst, &DecodeError{Kind: ErrMalformed, Offset: i, Detail: "want ',' or ']' after event " + strconv.Itoa(n)}
		}
	}
	if rest := skipJSONSpace(data, i); rest != len(data) {
		return dst, &DecodeError{Kind: ErrTrailingBytes, Offset: rest, Detail: strconv.Itoa(len(data)-rest) + " bytes after the value"}
	}
	return out, nil
}

// atEvent rebases a *DecodeError from decoding event n (which starts at
// offset at of the batch) onto the batch: offset and field path.
func atEvent(err error, n, at int) error {
	if de, ok := err.(*DecodeError); ok {
		de.Offset += at
		if de.Field != "" {
			de.Field = "[" + strconv.Itoa(n) + "]." + de.Field
		} else {
			de.Field = "[" + strconv.Itoa(n) + "]"
		}
	}
	return err
}

func skipJSONSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// maxJSONDepth bounds the nesting spanJSON follows; encoding/json stops at
// the same depth.
const maxJSONDepth = 10000

// spanJSON returns the end of the JSON value that starts at data[i], failing
// with ErrLimitExceeded as soon as an array inside it reaches maxArray+1
// elements (maxArray ≤ 0: no limit). It follows only the structure
// (brackets, braces, strings); encoding/json checks the syntax of the span
// afterwards. It allocates only its nesting stack, which is bounded.
func spanJSON(data []byte, i, maxArray int) (int, error) {
	const object = -1
	var stackArr [16]int32
	stack := stackArr[:0]   // element count of each open array; object for an object
	value := func() error { // a value starts inside the innermost container
		if len(stack) == 0 || stack[len(stack)-1] == object {
			return nil
		}
		stack[len(stack)-1]++
		if maxArray > 0 && int(stack[len(stack)-1]) > maxArray {
			return &DecodeError{Kind: ErrLimitExceeded, Offset: i,
				Detail: "an array inside the event has more than " + strconv.Itoa(maxArray) + " elements (blocks per event)"}
		}
		return nil
	}
	// Inside an object, a string is a key or a value; either way no array
	// element, so value() ignores it.
	for i < len(data) {
		switch c := data[i]; c {
		case ' ', '\t', '\n', '\r', ',', ':':
			i++
			continue
		case '[', '{':
			if err := value(); err != nil {
				return 0, err
			}
			if len(stack) == maxJSONDepth {
				return 0, &DecodeError{Kind: ErrMalformed, Offset: i, Detail: "nesting deeper than " + strconv.Itoa(maxJSONDepth)}
			}
			if c == '[' {
				stack = append(stack, 0)
			} else {
				stack = append(stack, object)
			}
			i++
		case ']', '}':
			if len(stack) == 0 || (c == ']') != (stack[len(stack)-1] != object) {
				return 0, &DecodeError{Kind: ErrMalformed, Offset: i, Detail: "unbalanced " + string(c)}
			}
			stack = stack[:len(stack)-1]
			i++
		case '"':
			if err := value(); err != nil {
				return 0, err
			}
			for i++; i < len(data) && data[i] != '"'; i++ {
				if data[i] == '\\' {
					i++
				}
			}
			if i >= len(data) {
				return 0, &DecodeError{Kind: ErrTruncated, Offset: len(data), Detail: "input ended inside a string"}
			}
			i++
		default: // a number or literal runs to the next delimiter
			if err := value(); err != nil {
				return 0, err
			}
			for i < len(data) && !isJSONDelim(data[i]) {
				i++
			}
		}
		if len(stack) == 0 {
			return i, nil
		}
	}
	return 0, &DecodeError{Kind: ErrTruncated, Offset: len(data), Detail: "input ended inside the JSON value"}
}

func isJSONDelim(c byte) bool {
	switch c {
	case ' ', '\t', '\n', '\r', ',', ':', '[', ']', '{', '}', '"':
		return true
	}
	return false
}

// AppendRouterEventJSON appends ev as one JSON object in the shape
// DecodeRouterEventJSON reads, with every field present (parent_hash null
// when absent; start_position only when set). It fails with
// [ErrInvalidEvent] for an unknown kind or storage tier.
func AppendRouterEventJSON(dst []byte, ev *ckf.RouterEvent) ([]byte, error) {
	if err := checkEvent(ev); err != nil {
		return dst, err
	}
	b := append(dst, `{"worker_id":`...)
	b = strconv.AppendUint(b, ev.WorkerID, 10)
	b = append(b, `,"storage_tier":"`...)
	b = append(b, ev.StorageTier.String()...)
	b = append(b, `","event":{"event_id":`...)
	b = strconv.AppendUint(b, ev.EventID, 10)
	b = append(b, `,"dp_rank":`...)
	b = strconv.AppendUint(b, uint64(ev.DPRank), 10)
	b = append(b, `,"data":`...)
	switch ev.Kind {
	case ckf.EventCleared:
		b = append(b, `"cleared"`...)
	case ckf.EventRemoved:
		b = append(b, `{"removed":{"block_hashes":[`...)
		for i, h := range ev.BlockHashes {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendUint(b, h, 10)
		}
		b = append(b, `]}}`...)
	default:
		b = append(b, `{"stored":{"parent_hash":`...)
		if ev.HasParent {
			b = strconv.AppendUint(b, ev.ParentHash, 10)
		} else {
			b = append(b, "null"...)
		}
		if ev.HasStartPosition {
			b = append(b, `,"start_position":`...)
			b = strconv.AppendUint(b, uint64(ev.StartPosition), 10)
		}
		b = append(b, `,"blocks":[`...)
		for i, blk := range ev.Blocks {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"block_hash":`...)
			b = strconv.AppendUint(b, blk.BlockHash, 10)
			b = append(b, `,"tokens_hash":`...)
			b = strconv.AppendUint(b, blk.TokensHash, 10)
			b = append(b, '}')
		}
		b = append(b, `]}}`...)
	}
	return append(b, `}}`...), nil
}

// AppendRouterEventsJSON appends evs as a JSON array (the batch form). On
// error it returns dst unchanged.
func AppendRouterEventsJSON(dst []byte, evs []ckf.RouterEvent) ([]byte, error) {
	b := append(dst, '[')
	var err error
	for i := range evs {
		if i > 0 {
			b = append(b, ',')
		}
		if b, err = AppendRouterEventJSON(b, &evs[i]); err != nil {
			return dst, err
		}
	}
	return append(b, ']'), nil
}
