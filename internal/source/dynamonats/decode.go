// Package dynamonats is a pool source that hears NVIDIA Dynamo's KV events
// on NATS (docs/ingest.md "Dynamo over NATS"): a core-NATS subscription on
// the KV-event subject, or a JetStream durable consumer on a stream holding
// it. Each message is one event-plane envelope (msgpack map: topic,
// publisher_id, sequence, published_at, payload) whose payload is a
// msgpack-encoded RouterEvent; older publishers sent a bare RouterEvent as
// JSON, which is accepted too.
//
// Worker identity is the RouterEvent's (worker_id, dp_rank). The envelope's
// publisher_id names one publisher lifetime: a new one for a member is a
// restarted engine, so the member is reset under a new source epoch before
// its events apply. The envelope sequence is the publisher's (one worker's
// publisher carries all its dp ranks): a gap in it resets each of the
// publisher's members degraded (events were lost, any member's exact state
// is unknown).
package dynamonats

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/source"
	"github.com/ckfrelay/ckfrelay/wire"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// maxSkipDepth bounds the nesting of an unknown envelope field's value, as
// the ZMQ source bounds ignored values.
const maxSkipDepth = 32

// ErrMalformed wraps every decode failure.
var ErrMalformed = errors.New("dynamonats: malformed message")

// ErrOutOfRange: an envelope integer is negative (publisher_id: -5,
// sequence: -1) or not an integer at all. Such errors match ErrMalformed
// too. Dynamo writes these fields as u64; a negative value read as unsigned
// would be a huge sequence (a false gap) or another publisher.
var ErrOutOfRange = errors.New("dynamonats: envelope value out of range")

// Envelope is Dynamo's event-plane envelope (EventEnvelope in
// lib/runtime/src/transports/event_plane/traits.rs), written by rmp_serde as
// a map keyed by field name.
type Envelope struct {
	Topic       string `msgpack:"topic"`
	PublisherID uint64 `msgpack:"publisher_id"`
	Sequence    uint64 `msgpack:"sequence"`
	PublishedAt uint64 `msgpack:"published_at"` // unix ms
	Payload     []byte `msgpack:"payload"`
	// Enveloped is false for a legacy bare JSON RouterEvent (no publisher
	// identity, no sequence).
	Enveloped bool `msgpack:"-"`
}

// DefaultLimits are the batch limits a zero Config.Limits takes: the HTTP
// API's defaults (docs/limits.md).
var DefaultLimits = wire.BatchLimits{MaxEvents: 4096, MaxBlocksPerEvent: 4096}

// Decode decodes one message into its envelope and events (appended to dst)
// under DefaultLimits. A payload is one RouterEvent map or an array of them.
// Nothing is returned on error.
func Decode(data []byte, dst []ckf.RouterEvent) (Envelope, []ckf.RouterEvent, error) {
	return DecodeLimited(data, dst, DefaultLimits)
}

// DecodeLimited is Decode under lim: more events in one message than
// lim.MaxEvents, or more blocks (hashes) in one event than
// lim.MaxBlocksPerEvent, fail with an error matching both ErrMalformed and
// wire.ErrLimitExceeded, before the excess is allocated.
func DecodeLimited(data []byte, dst []ckf.RouterEvent, lim wire.BatchLimits) (Envelope, []ckf.RouterEvent, error) {
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	if len(trimmed) > 0 && trimmed[0] == '{' {
		evs, err := wire.DecodeRouterEventsJSONLimited(append(append([]byte{'['}, trimmed...), ']'), nil, wire.BatchLimits{MaxEvents: 1, MaxBlocksPerEvent: lim.MaxBlocksPerEvent})
		if err != nil {
			return Envelope{}, dst, fmt.Errorf("%w: legacy JSON RouterEvent: %w", ErrMalformed, err)
		}
		return Envelope{}, append(dst, evs...), nil
	}
	env, err := decodeEnvelope(data)
	if err != nil {
		return Envelope{}, dst, fmt.Errorf("%w: envelope: %w", ErrMalformed, err)
	}
	if len(env.Payload) == 0 {
		return Envelope{}, dst, fmt.Errorf("%w: envelope without payload", ErrMalformed)
	}
	env.Enveloped = true
	n := len(dst)
	switch b := env.Payload[0]; {
	case b >= 0x90 && b <= 0x9f, b == 0xdc, b == 0xdd: // an array: a batch
		dst, err = wire.DecodeRouterEventsMsgpackLimited(env.Payload, dst, lim)
	default:
		var ev ckf.RouterEvent
		if ev, err = wire.DecodeRouterEventMsgpackLimited(env.Payload, lim.MaxBlocksPerEvent); err == nil {
			dst = append(dst, ev)
		}
	}
	if err != nil {
		return Envelope{}, dst[:n], fmt.Errorf("%w: payload RouterEvent: %w", ErrMalformed, err)
	}
	return env, dst, nil
}

// envelopeFields is the envelope's field order, for the array form serde
// writes without field names.
var envelopeFields = [...]string{"topic", "publisher_id", "sequence", "published_at", "payload"}

// decodeEnvelope reads the envelope as a map keyed by field name (unknown
// keys skipped) or as an array in field order, the two forms rmp_serde
// writes. Integers must be non-negative integers of any width; a nil field
// is its zero value. Nothing may follow the envelope.
func decodeEnvelope(data []byte) (Envelope, error) {
	br := bytes.NewReader(data)
	dec := msgpack.NewDecoder(br)
	var env Envelope
	field := func(name string) error {
		var err error
		switch name {
		case "topic":
			env.Topic, err = dec.DecodeString()
		case "publisher_id":
			env.PublisherID, err = unsigned(dec, name)
		case "sequence":
			env.Sequence, err = unsigned(dec, name)
		case "published_at":
			env.PublishedAt, err = unsigned(dec, name)
		case "payload":
			env.Payload, err = dec.DecodeBytes()
		default:
			// Dynamo's envelope has no nested field; the bound keeps a
			// deep unknown value from overflowing the stack.
			err = source.SkipMsgpack(dec, maxSkipDepth)
		}
		if err != nil && !errors.Is(err, ErrOutOfRange) {
			err = fmt.Errorf("%s: %w", name, err)
		}
		return err
	}
	c, err := dec.PeekCode()
	if err != nil {
		return env, err
	}
	if msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32 {
		n, err := dec.DecodeArrayLen()
		if err != nil {
			return env, err
		}
		for i := range n {
			name := ""
			if i < len(envelopeFields) {
				name = envelopeFields[i]
			}
			if err := field(name); err != nil {
				return env, err
			}
		}
	} else {
		n, err := dec.DecodeMapLen()
		if err != nil {
			return env, err
		}
		if n < 0 {
			return env, errors.New("nil envelope")
		}
		for range n {
			key, err := dec.DecodeString()
			if err != nil {
				return env, fmt.Errorf("key: %w", err)
			}
			if err := field(key); err != nil {
				return env, err
			}
		}
	}
	if br.Len() > 0 {
		return env, fmt.Errorf("%d bytes after the envelope", br.Len())
	}
	return env, nil
}

// unsigned reads a non-negative integer field; nil reads as 0.
func unsigned(dec *msgpack.Decoder, name string) (uint64, error) {
	c, err := dec.PeekCode()
	if err != nil {
		return 0, err
	}
	switch {
	case c == msgpcode.Nil:
		return 0, dec.DecodeNil()
	case c <= msgpcode.PosFixedNumHigh, c >= msgpcode.Uint8 && c <= msgpcode.Uint64:
		return dec.DecodeUint64()
	case c >= msgpcode.NegFixedNumLow, c >= msgpcode.Int8 && c <= msgpcode.Int64:
		v, err := dec.DecodeInt64()
		if err != nil {
			return 0, err
		}
		if v < 0 {
			return 0, fmt.Errorf("%w: %s %d is negative", ErrOutOfRange, name, v)
		}
		return uint64(v), nil
	}
	return 0, fmt.Errorf("%w: %s is not an integer (msgpack code 0x%02x)", ErrOutOfRange, name, c)
}

// Encode writes an envelope around evs the way Dynamo's event plane does
// (for tests and the demo): payload = one RouterEvent map when len(evs) == 1,
// else an array of them.
func Encode(env Envelope, evs []ckf.RouterEvent) ([]byte, error) {
	var err error
	if len(evs) == 1 {
		env.Payload, err = wire.AppendRouterEventMsgpack(nil, &evs[0])
	} else {
		env.Payload, err = wire.AppendRouterEventsMsgpack(nil, evs)
	}
	if err != nil {
		return nil, err
	}
	return msgpack.Marshal(&env)
}
