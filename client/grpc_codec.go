package client

import (
	"bytes"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	protov2 "google.golang.org/protobuf/proto"

	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

// Field numbers of dynamo.kvrelay.v1.FilterUpdate (relay.proto).
const (
	fuProtocolVersion = 1
	fuRelay           = 2
	fuProducer        = 3
	fuBaseSequence    = 4
	fuSequence        = 5
	fuSendTs          = 6
	fuKind            = 7
	fuPayload         = 8
	fuContractMarker  = 127
)

// retainedPayloadBytes bounds the payload buffer an updateCodec keeps
// between messages: deltas (a few KiB) reuse it; a larger payload (a
// snapshot chunk, up to 8 MiB) gets a buffer of its own, as proto.Unmarshal
// would give it, which is not kept.
const retainedPayloadBytes = 64 << 10

// maxCachedIdentityBytes bounds an identity's encoding the codec keeps to
// compare with the next update's (a relay's are under 200 bytes): a larger
// one is decoded for its update alone.
const maxCachedIdentityBytes = 4 << 10

// updateCodec is the codec of one SubscribeKvPool stream (docs/RATIONALE.md
// "Why does the router decode FilterUpdates with a codec of its own?"). It
// decodes a FilterUpdate into the message the stream reuses, copying the
// payload into a buffer it reuses, and decodes the relay and producer
// identities only when their bytes differ from the previous update's (on a
// stream they never do: every update repeats them), so a delta costs no
// allocation. It takes only the encoding proto.Unmarshal cannot read
// differently: each known field at most once with its own wire type, no
// unknown field. Anything else — and every other message type, and every
// Marshal — goes to grpc-go's proto codec, so the result is always
// proto.Unmarshal's (TestUpdateCodec_DecodesAsProtoUnmarshal).
//
// A stream's messages are received one at a time by the goroutine that
// calls RecvMsg, so the codec needs no lock; it is not shared between
// streams.
type updateCodec struct {
	proto encoding.CodecV2

	relayRaw, producerRaw []byte
	relay                 *kvrelaypb.RelayIdentity
	producer              *kvrelaypb.ProducerIdentity
	payload               []byte
	scratch               []byte // a message received in several buffers, joined
}

func newUpdateCodec() *updateCodec { return &updateCodec{proto: encoding.GetCodecV2(proto.Name)} }

func (c *updateCodec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }

// Name is empty so that grpc-go leaves the call's content-type as it is for
// every other RPC ("application/grpc"): the codec changes no byte on the
// wire. (grpc.ForceCodecV2 takes a non-empty name as the content-subtype.)
func (c *updateCodec) Name() string { return "" }

func (c *updateCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*kvrelaypb.FilterUpdate)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	var b []byte
	if len(data) == 1 {
		b = data[0].ReadOnlyData()
	} else {
		c.scratch = c.scratch[:0]
		for _, d := range data {
			c.scratch = append(c.scratch, d.ReadOnlyData()...)
		}
		b = c.scratch
		defer func() {
			if cap(c.scratch) > retainedPayloadBytes {
				c.scratch = nil
			}
		}()
	}
	if c.decode(b, m) {
		return nil
	}
	return c.proto.Unmarshal(data, v)
}

// decode fills m from b when b is in the subset it takes, and reports
// whether it did. m is left reset otherwise.
func (c *updateCodec) decode(b []byte, m *kvrelaypb.FilterUpdate) bool {
	m.Reset()
	var seen uint16 // bit i: field i (1..8), bit 9: contract_marker
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		bit := uint16(1) << min(uint(num), 9)
		if num > fuPayload && num != fuContractMarker || seen&bit != 0 {
			// An unknown field (kept as unknown by proto.Unmarshal) or a
			// repeated one (the last wins, submessages merge).
			return false
		}
		seen |= bit
		switch {
		case num == fuContractMarker && typ == protowire.Fixed32Type:
			v, n := protowire.ConsumeFixed32(b)
			if n < 0 {
				return false
			}
			m.ContractMarker, b = v, b[n:]
		case (num == fuRelay || num == fuProducer || num == fuPayload) && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return false
			}
			b = b[n:]
			switch num {
			case fuRelay:
				if m.Relay = decodeCached(v, &c.relay, &c.relayRaw); m.Relay == nil {
					return false
				}
			case fuProducer:
				if m.Producer = decodeCached(v, &c.producer, &c.producerRaw); m.Producer == nil {
					return false
				}
			default:
				if len(v) > retainedPayloadBytes {
					m.Payload = bytes.Clone(v)
					break
				}
				c.payload = append(c.payload[:0], v...)
				m.Payload = c.payload
			}
		case num >= fuProtocolVersion && num <= fuKind && num != fuRelay && num != fuProducer && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return false
			}
			b = b[n:]
			switch num {
			case fuProtocolVersion:
				m.ProtocolVersion = uint32(v)
			case fuBaseSequence:
				m.BaseSequence = v
			case fuSequence:
				m.Sequence = v
			case fuSendTs:
				m.SendTsUs = v
			default:
				m.Kind = kvrelaypb.FilterUpdateKind(int32(v))
			}
		default:
			return false // a known field with another wire type: proto keeps it as unknown
		}
	}
	return true
}

// decodeCached returns the message b encodes: *last when b is the encoding
// *raw holds, else a new one, kept in *last and *raw for the next update
// when b is not larger than maxCachedIdentityBytes. nil when b does not
// decode.
func decodeCached[M any, P interface {
	*M
	protov2.Message
}](b []byte, last *P, raw *[]byte) P {
	if *last != nil && bytes.Equal(b, *raw) {
		return *last
	}
	m := P(new(M))
	if protov2.Unmarshal(b, m) != nil {
		return nil
	}
	if len(b) > maxCachedIdentityBytes {
		*last, *raw = nil, nil
		return m
	}
	*last, *raw = m, append((*raw)[:0], b...)
	return m
}
