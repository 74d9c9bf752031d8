package kvrelay_test

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/ckfrelay/ckfrelay/wire/kvrelay"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

// TestMarker_WireBytes pins the marker on the wire: field 127, wire type 5
// (fixed32), tag varint fd 07, then 0x4B565231 little-endian = "1RVK".
func TestMarker_WireBytes(t *testing.T) {
	assert.Equal(t, kvrelay.ContractMarker, binary.BigEndian.Uint32([]byte("KVR1")))
	m := &kvrelaypb.RelayInfoRequest{}
	kvrelay.StampRequest(m)
	b, err := proto.Marshal(m)
	require.NoError(t, err)
	assert.Equal(t, []byte{0xfd, 0x07, 0x31, 0x52, 0x56, 0x4b}, b)
}

// topLevel returns the request and response messages of the service's RPCs.
func topLevel(t *testing.T) (requests, responses []protoreflect.MessageType) {
	t.Helper()
	svc := kvrelaypb.File_dynamo_kvrelay_v1_relay_proto.Services().ByName("KvEventRelay")
	require.NotNil(t, svc)
	methods := svc.Methods()
	require.Equal(t, 6, methods.Len())
	find := func(d protoreflect.MessageDescriptor) protoreflect.MessageType {
		mt, err := protoregistry.GlobalTypes.FindMessageByName(d.FullName())
		require.NoError(t, err)
		return mt
	}
	for i := range methods.Len() {
		requests = append(requests, find(methods.Get(i).Input()))
		responses = append(responses, find(methods.Get(i).Output()))
	}
	return requests, responses
}

// TestEnvelope_EveryTopLevelMessage checks the contract's envelope on every
// request and response of the service, and that no nested message has
// field 127.
func TestEnvelope_EveryTopLevelMessage(t *testing.T) {
	requests, responses := topLevel(t)
	top := map[protoreflect.FullName]bool{}
	for _, mt := range requests {
		d := mt.Descriptor()
		top[d.FullName()] = true
		f := d.Fields().ByNumber(kvrelay.ContractMarkerField)
		require.NotNil(t, f, "%s", d.FullName())
		assert.Equal(t, protoreflect.Name("contract_marker"), f.Name())
		assert.Equal(t, protoreflect.Fixed32Kind, f.Kind())

		m, ok := mt.New().Interface().(kvrelay.Request)
		require.True(t, ok, "%s implements kvrelay.Request", d.FullName())
		require.ErrorIs(t, kvrelay.CheckRequest(m), kvrelay.ErrContractMismatch, "%s unstamped", d.FullName())
		kvrelay.StampRequest(m)
		require.NoError(t, kvrelay.CheckRequest(m))
		assert.Equal(t, kvrelay.ContractMarker, m.GetContractMarker())
	}
	relay := &kvrelaypb.RelayIdentity{DrtInstanceId: 1, RelayIncarnation: 2}
	for _, mt := range responses {
		d := mt.Descriptor()
		top[d.FullName()] = true
		require.Equal(t, protoreflect.Name("protocol_version"), d.Fields().ByNumber(1).Name(), "%s", d.FullName())
		require.Equal(t, protoreflect.Name("relay"), d.Fields().ByNumber(2).Name(), "%s", d.FullName())
		require.Equal(t, protoreflect.Name("contract_marker"), d.Fields().ByNumber(127).Name(), "%s", d.FullName())

		m, ok := mt.New().Interface().(kvrelay.Response)
		require.True(t, ok, "%s implements kvrelay.Response", d.FullName())
		require.ErrorIs(t, kvrelay.CheckResponse(m), kvrelay.ErrContractMismatch)
		kvrelay.StampResponse(m, relay)
		require.NoError(t, kvrelay.CheckResponse(m))
		assert.Same(t, relay, m.GetRelay())
		assert.Equal(t, kvrelay.ProtocolVersion, m.GetProtocolVersion())

		r := m.ProtoReflect()
		r.Set(d.Fields().ByNumber(1), protoreflect.ValueOfUint32(2))
		require.ErrorIs(t, kvrelay.CheckResponse(m), kvrelay.ErrProtocolVersion)
		r.Set(d.Fields().ByNumber(1), protoreflect.ValueOfUint32(1))
		r.Clear(d.Fields().ByNumber(2))
		require.ErrorIs(t, kvrelay.CheckResponse(m), kvrelay.ErrMissingRelay)
		r.Set(d.Fields().ByNumber(127), protoreflect.ValueOfUint32(kvrelay.ContractMarker+1))
		require.ErrorIs(t, kvrelay.CheckResponse(m), kvrelay.ErrContractMismatch, "the marker is checked first")
	}
	assert.Len(t, top, 12)
	msgs := kvrelaypb.File_dynamo_kvrelay_v1_relay_proto.Messages()
	for i := range msgs.Len() {
		d := msgs.Get(i)
		if !top[d.FullName()] {
			assert.Nil(t, d.Fields().ByNumber(127), "nested message %s has no contract marker", d.FullName())
		}
	}
}

func TestCheckSubscriberID(t *testing.T) {
	for _, id := range []string{"router-a", "x", strings.Repeat("é", 64), "dc 1 / lane 3"} {
		assert.NoError(t, kvrelay.CheckSubscriberID(id), "%q", id)
	}
	for _, id := range []string{"", strings.Repeat("a", 129), strings.Repeat("é", 64) + "a", "a\nb", "tab\t", "\x7f", "\u0085", "\xff"} {
		assert.ErrorIs(t, kvrelay.CheckSubscriberID(id), kvrelay.ErrInvalidSubscriberID, "%q", id)
	}
}
