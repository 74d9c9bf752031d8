// Package kvrelaypb is the Go code generated from
// wire/kvrelay/proto/dynamo/kvrelay/v1/relay.proto, ckfrelay's copy of
// the schema of NVIDIA Dynamo's dynamo.kvrelay.v1.KvEventRelay gRPC service:
// messages, the KvEventRelayClient and KvEventRelayServer interfaces and
// RegisterKvEventRelayServer. Everything but this file is generated: change
// the .proto and run `make proto` (`make proto-check` fails when they
// differ). The envelope rules (marker, protocol version, error reasons) are
// in package wire/kvrelay.
//
// See docs/RATIONALE.md "Why protoc from Debian and plugins pinned in a tools module?".
package kvrelaypb
