package kvrelay

import (
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

// Request is a top-level request message: it carries the contract marker.
// Every *Request message of kvrelaypb implements it.
type Request interface {
	proto.Message
	GetContractMarker() uint32
}

// Response is a top-level response message: marker, protocol version and
// the relay's identity. Every response message of kvrelaypb (RelayInfo and
// the five stream updates) implements it.
type Response interface {
	Request
	GetProtocolVersion() uint32
	GetRelay() *kvrelaypb.RelayIdentity
}

// Envelope check failures. Errors of [CheckRequest], [CheckResponse] and
// [CheckSubscriberID] wrap one of them.
var (
	// ErrContractMismatch: the contract marker is not ContractMarker. A
	// server answers it with RELAY_ERROR_REASON_CONTRACT_MISMATCH.
	ErrContractMismatch = errors.New("kvrelay: contract marker mismatch")
	// ErrProtocolVersion: a response's protocol_version is not
	// ProtocolVersion. A consumer applies no state from it.
	ErrProtocolVersion = errors.New("kvrelay: unsupported protocol version")
	// ErrMissingRelay: a response without its RelayIdentity.
	ErrMissingRelay = errors.New("kvrelay: response without relay identity")
	// ErrInvalidSubscriberID: an empty subscriber_id, one over
	// MaxSubscriberIDBytes bytes, not UTF-8, or with a control character. A
	// server answers it with RELAY_ERROR_REASON_INVALID_REQUEST.
	ErrInvalidSubscriberID = errors.New("kvrelay: invalid subscriber_id")
)

// StampRequest sets m's contract marker.
func StampRequest(m Request) {
	r := m.ProtoReflect()
	r.Set(field(r, ContractMarkerField), protoreflect.ValueOfUint32(ContractMarker))
}

// StampResponse sets m's contract marker, protocol version and relay
// identity (m then aliases relay).
func StampResponse(m Response, relay *kvrelaypb.RelayIdentity) {
	StampRequest(m)
	r := m.ProtoReflect()
	r.Set(field(r, protocolVersionField), protoreflect.ValueOfUint32(ProtocolVersion))
	r.Set(field(r, relayField), protoreflect.ValueOfMessage(relay.ProtoReflect()))
}

// Field numbers every response shares (checked for every message by the
// package's tests).
const (
	protocolVersionField = 1
	relayField           = 2
)

// field returns the descriptor of field n of r. Request and Response are
// implemented only by messages that have it, so a miss is a programming error.
func field(r protoreflect.Message, n protoreflect.FieldNumber) protoreflect.FieldDescriptor {
	fd := r.Descriptor().Fields().ByNumber(n)
	if fd == nil {
		panic(fmt.Sprintf("kvrelay: %s has no field %d", r.Descriptor().FullName(), n))
	}
	return fd
}

// CheckRequest is the server's envelope check: nil, or an error wrapping
// [ErrContractMismatch]. Answer a failure with [Fail] and
// RELAY_ERROR_REASON_CONTRACT_MISMATCH.
func CheckRequest(m Request) error {
	if got := m.GetContractMarker(); got != ContractMarker {
		return fmt.Errorf("%w: %s carries %#08x, expected %#08x", ErrContractMismatch, m.ProtoReflect().Descriptor().Name(), got, ContractMarker)
	}
	return nil
}

// CheckResponse is the consumer's envelope check, made before applying any
// state from m: the marker ([ErrContractMismatch]), the protocol version
// ([ErrProtocolVersion]) and a relay identity ([ErrMissingRelay]), in that
// order.
func CheckResponse(m Response) error {
	name := m.ProtoReflect().Descriptor().Name()
	if got := m.GetContractMarker(); got != ContractMarker {
		return fmt.Errorf("%w: %s carries %#08x, expected %#08x", ErrContractMismatch, name, got, ContractMarker)
	}
	if got := m.GetProtocolVersion(); got != ProtocolVersion {
		return fmt.Errorf("%w: %s carries protocol version %d, expected %d", ErrProtocolVersion, name, got, ProtocolVersion)
	}
	if m.GetRelay() == nil {
		return fmt.Errorf("%w: %s", ErrMissingRelay, name)
	}
	return nil
}

// CheckSubscriberID checks a streaming request's subscriber_id: non-empty,
// at most [MaxSubscriberIDBytes] bytes of UTF-8, no control characters. It
// is a diagnostic label, never an identity.
func CheckSubscriberID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: empty", ErrInvalidSubscriberID)
	case len(id) > MaxSubscriberIDBytes:
		return fmt.Errorf("%w: %d bytes, at most %d", ErrInvalidSubscriberID, len(id), MaxSubscriberIDBytes)
	case !utf8.ValidString(id):
		return fmt.Errorf("%w: not UTF-8", ErrInvalidSubscriberID)
	}
	for _, r := range id {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: control character %U", ErrInvalidSubscriberID, r)
		}
	}
	return nil
}
