// Package kvrelay holds the envelope rules of NVIDIA Dynamo's
// dynamo.kvrelay.v1.KvEventRelay gRPC contract that ckfrelay's server and
// client share: the contract marker and protocol version every message
// carries, stamping and checking them, the machine-readable error reasons
// with their gRPC codes and client actions, the trailer that carries a
// reason, and the contract's limits. The messages and stubs are generated in
// [kvrelaypb]; CBI1 payloads are package wire/cbi1.
//
// Source: Dynamo's lib/llm/src/kv_dc_relay/docs/grpc-contract.md @d95e45a5
// ("Envelope and versioning", "Machine-Readable Errors", "RPCs"); notes in
// docs/wire.md §8 and docs/RATIONALE.md "Why are the generated code and the
// envelope rules public (wire/kvrelay, wire/kvrelay/kvrelaypb)?".
//
// Functions are safe for concurrent use; they do not retain the messages
// they are given.
package kvrelay

// Envelope constants of the contract. They are exchanged with Dynamo and must
// not change.
const (
	// ContractMarker is the required value of the fixed32 contract_marker,
	// field 127 of every top-level request and response: "KVR1" read as a
	// big-endian number.
	ContractMarker uint32 = 0x4B565231
	// ContractMarkerField is the field number of contract_marker.
	ContractMarkerField = 127
	// ProtocolVersion is the protocol_version every response carries (the
	// contract's compatibility major).
	ProtocolVersion uint32 = 1
	// ErrorReasonTrailer is the ASCII trailing-metadata key whose value is the
	// exact RelayErrorReason name of an application error.
	ErrorReasonTrailer = "kv-relay-error-reason"
	// MaxMessageBytes is the server's default maximum message size, which
	// clients must accept too: a full snapshot chunk is 4 MiB of words plus
	// CBI1 and protobuf headers, over gRPC's default 4 MiB receive limit.
	MaxMessageBytes = 8 << 20
	// MaxSubscriberIDBytes bounds a streaming request's subscriber_id.
	MaxSubscriberIDBytes = 128
)
