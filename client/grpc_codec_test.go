package client

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

// randomUpdateBytes returns an encoding of a FilterUpdate as a peer may send
// it: mostly what a relay sends (every field once, in any order, the
// identities of a few producers), and now and then what only a hostile or
// newer peer would: a field twice, an unknown field, a known field with
// another wire type, a truncated or corrupted byte string.
func randomUpdateBytes(rng *rand.Rand, producers [][]byte, relays [][]byte) []byte {
	type field func([]byte) []byte
	varint := func(num protowire.Number, v uint64) field {
		return func(b []byte) []byte {
			return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
		}
	}
	bytesField := func(num protowire.Number, v []byte) field {
		return func(b []byte) []byte {
			return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), v)
		}
	}
	big := func() uint64 {
		if rng.IntN(4) == 0 {
			return rng.Uint64() // past uint32 and int32: truncated as proto does
		}
		return uint64(rng.IntN(1000))
	}
	payload := make([]byte, []int{0, 1, 40, 900, retainedPayloadBytes + 1 + rng.IntN(1000)}[rng.IntN(5)])
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	fields := []field{
		varint(fuProtocolVersion, big()), bytesField(fuRelay, relays[rng.IntN(len(relays))]),
		bytesField(fuProducer, producers[rng.IntN(len(producers))]), varint(fuBaseSequence, rng.Uint64()),
		varint(fuSequence, rng.Uint64()), varint(fuSendTs, rng.Uint64()), varint(fuKind, big()), bytesField(fuPayload, payload),
		func(b []byte) []byte {
			return protowire.AppendFixed32(protowire.AppendTag(b, fuContractMarker, protowire.Fixed32Type), kvrelay.ContractMarker)
		},
	}
	rng.Shuffle(len(fields), func(i, j int) { fields[i], fields[j] = fields[j], fields[i] })
	fields = fields[:rng.IntN(len(fields)+1)]
	if rng.IntN(3) == 0 { // something only proto.Unmarshal takes
		switch rng.IntN(5) {
		case 0:
			if len(fields) > 0 {
				fields = append(fields, fields[rng.IntN(len(fields))]) // a field twice
			}
		case 1:
			fields = append(fields, varint(protowire.Number(9+rng.IntN(200)), rng.Uint64()))
		case 2:
			fields = append(fields, bytesField(protowire.Number(1+rng.IntN(8)), payload[:min(len(payload), 3)]))
		case 3:
			fields = append(fields, varint(protowire.Number(1+rng.IntN(8)), rng.Uint64()))
		case 4:
			fields = append(fields, bytesField(fuProducer, []byte{0x0a, 0x02, 0x08})) // a truncated submessage
		}
	}
	var b []byte
	for _, f := range fields {
		b = f(b)
	}
	switch {
	case len(b) > 0 && rng.IntN(8) == 0:
		b = b[:rng.IntN(len(b))]
	case len(b) > 0 && rng.IntN(8) == 0:
		b[rng.IntN(len(b))] ^= byte(1 + rng.IntN(255))
	}
	return b
}

// split cuts b into up to three buffers, as grpc-go hands a message received
// in several DATA frames to the codec.
func split(rng *rand.Rand, b []byte) mem.BufferSlice {
	if len(b) < 2 || rng.IntN(2) == 0 {
		return mem.BufferSlice{mem.SliceBuffer(b)}
	}
	i := 1 + rng.IntN(len(b)-1)
	j := i + rng.IntN(len(b)-i+1)
	return mem.BufferSlice{mem.SliceBuffer(b[:i]), mem.SliceBuffer(b[i:j]), mem.SliceBuffer(b[j:])}
}

// The router's codec gives every encoding exactly what proto.Unmarshal
// gives (or fails where it fails), across a stream of updates whose
// identities repeat and change, whatever it takes itself and whatever it
// leaves to proto.
func TestUpdateCodec_DecodesAsProtoUnmarshal(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	var producers, relays [][]byte
	for i := range 3 {
		id := testID
		id.ProducerIncarnation += uint64(i)
		b, err := proto.Marshal(kvrelay.ProducerToWire(id))
		require.NoError(t, err)
		producers = append(producers, b)
		b, err = proto.Marshal(&kvrelaypb.RelayIdentity{DrtInstanceId: uint64(i), RelayIncarnation: 7})
		require.NoError(t, err)
		relays = append(relays, b)
	}
	producers = append(producers, []byte{0xff}) // not a message
	// A producer with an unknown field past what the codec keeps to compare.
	huge := protowire.AppendBytes(protowire.AppendTag(append([]byte(nil), producers[0]...), 99, protowire.BytesType), make([]byte, maxCachedIdentityBytes))
	producers = append(producers, huge)
	c := newUpdateCodec()
	var got kvrelaypb.FilterUpdate
	fast := 0
	for i := range 20000 {
		b := randomUpdateBytes(rng, producers, relays)
		want := &kvrelaypb.FilterUpdate{}
		werr := proto.Unmarshal(b, want)
		gerr := c.Unmarshal(split(rng, b), &got)
		if werr != nil {
			require.Error(t, gerr, "case %d: %x", i, b)
			continue
		}
		require.NoError(t, gerr, "case %d: %x", i, b)
		require.True(t, proto.Equal(want, &got), "case %d: %x\nwant %v\ngot  %v", i, b, want, &got)
		var probe kvrelaypb.FilterUpdate
		if c.decode(b, &probe) {
			fast++
		}
		require.LessOrEqual(t, cap(c.producerRaw), maxCachedIdentityBytes, "an identity past the bound is not kept")
		require.LessOrEqual(t, cap(c.payload), retainedPayloadBytes, "a payload past the bound is not kept")
		require.LessOrEqual(t, cap(c.scratch), retainedPayloadBytes, "a joined message past the bound is not kept")
	}
	assert.Greater(t, fast, 5000, "most encodings are a relay's, which the codec decodes itself")
}

// Every other message goes to grpc-go's proto codec, and Marshal too.
func TestUpdateCodec_OtherMessagesAreProtos(t *testing.T) {
	c := newUpdateCodec()
	req := &kvrelaypb.SubscribeKvPoolRequest{SubscriberId: "r", ExpectedProducer: kvrelay.ProducerToWire(testID)}
	kvrelay.StampRequest(req)
	out, err := c.Marshal(req)
	require.NoError(t, err)
	want, err := proto.Marshal(req)
	require.NoError(t, err)
	assert.Equal(t, want, out.Materialize())
	var back kvrelaypb.SubscribeKvPoolRequest
	require.NoError(t, c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(want)}, &back))
	assert.True(t, proto.Equal(req, &back))
	assert.Empty(t, c.Name(), "the call's content-type stays application/grpc")
}

// A delta as a relay sends it costs the router no allocation once its
// stream has received one (grpc-go's proto codec: one per message, its
// payload, and each of the identities' nested messages).
func TestUpdateCodec_DeltaAllocatesNothing(t *testing.T) {
	images := make([]ckf.BucketImage, 64)
	for i := range images {
		images[i] = ckf.BucketImage{Bucket: uint32(i), Word: uint64(i) * 0x9e3779b97f4a7c15}
	}
	m := &kvrelaypb.FilterUpdate{Producer: kvrelay.ProducerToWire(testID), BaseSequence: 4, Sequence: 5, SendTsUs: 99,
		Kind: kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_DELTA, Payload: make([]byte, 64+12+12*len(images))}
	kvrelay.StampResponse(m, &kvrelaypb.RelayIdentity{DrtInstanceId: 1, RelayIncarnation: 2})
	b, err := proto.Marshal(m)
	require.NoError(t, err)
	data := mem.BufferSlice{mem.SliceBuffer(b)}
	for _, tc := range []struct {
		name  string
		codec encoding.CodecV2
		max   float64
	}{{"router's codec", newUpdateCodec(), 0}, {"grpc-go's proto codec", encoding.GetCodecV2(grpcproto.Name), -1}} {
		var got kvrelaypb.FilterUpdate
		require.NoError(t, tc.codec.Unmarshal(data, &got))
		allocs := testing.AllocsPerRun(100, func() { _ = tc.codec.Unmarshal(data, &got) })
		require.True(t, proto.Equal(m, &got))
		if tc.max >= 0 {
			assert.LessOrEqual(t, allocs, tc.max, tc.name)
		} else {
			t.Logf("%s: %.0f allocations per delta", tc.name, allocs)
		}
	}
}
