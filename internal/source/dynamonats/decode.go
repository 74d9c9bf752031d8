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
// its events apply; an envelope sequence gap resets it degraded (events were
// lost and the member's exact state is unknown).
package dynamonats

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire"
	"github.com/vmihailenco/msgpack/v5"
)

// ErrMalformed wraps every decode failure.
var ErrMalformed = errors.New("dynamonats: malformed message")

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

// maxPayloadEvents bounds the events one message may carry.
const maxPayloadEvents = 4096

// Decode decodes one message into its envelope and events (appended to dst).
// A payload is one RouterEvent map or an array of them. Nothing is returned
// on error.
func Decode(data []byte, dst []ckf.RouterEvent) (Envelope, []ckf.RouterEvent, error) {
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	if len(trimmed) > 0 && trimmed[0] == '{' {
		ev, err := wire.DecodeRouterEventJSON(trimmed)
		if err != nil {
			return Envelope{}, dst, fmt.Errorf("%w: legacy JSON RouterEvent: %w", ErrMalformed, err)
		}
		return Envelope{}, append(dst, ev), nil
	}
	var env Envelope
	if err := msgpack.Unmarshal(data, &env); err != nil {
		return Envelope{}, dst, fmt.Errorf("%w: envelope: %w", ErrMalformed, err)
	}
	if len(env.Payload) == 0 {
		return Envelope{}, dst, fmt.Errorf("%w: envelope without payload", ErrMalformed)
	}
	env.Enveloped = true
	n := len(dst)
	var err error
	switch b := env.Payload[0]; {
	case b >= 0x90 && b <= 0x9f, b == 0xdc, b == 0xdd: // an array: a batch
		dst, err = wire.DecodeRouterEventsMsgpack(env.Payload, dst)
	default:
		var ev ckf.RouterEvent
		if ev, err = wire.DecodeRouterEventMsgpack(env.Payload); err == nil {
			dst = append(dst, ev)
		}
	}
	if err != nil {
		return Envelope{}, dst[:n], fmt.Errorf("%w: payload RouterEvent: %w", ErrMalformed, err)
	}
	if len(dst)-n > maxPayloadEvents {
		return Envelope{}, dst[:n], fmt.Errorf("%w: %d events in one message exceed %d", ErrMalformed, len(dst)-n, maxPayloadEvents)
	}
	return env, dst, nil
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
