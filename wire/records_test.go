package wire_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire"
)

func recordIdentity() ckf.ProducerIdentity {
	d := ckf.Domain{CacheSemantics: ckf.ScopedDigest{Digest: [16]byte{1, 2}, Source: ckf.DigestExplicit},
		RoutingScope: ckf.ScopedDigest{Digest: [16]byte{9}}}
	return ckf.ProducerIdentity{Pool: ckf.PoolID{Domain: d, DCID: math.MaxUint64}, ProducerIncarnation: 1 << 40,
		LayoutGeneration: 3, Format: ckf.NewFormat(ckf.DefaultSeed, 1<<20)}
}

// TestRecords_SameBytesAsInFrames: the standalone parts are byte for byte
// what a frame carries, and read back through a Decoder.
func TestRecords_SameBytesAsInFrames(t *testing.T) {
	id := recordIdentity()
	lease := ckf.LaneLease{ConsumerInstance: 7, PhysicalLane: 15, AssignmentEpoch: 1 << 33}
	frame, err := wire.AppendFrame(nil, &wire.Frame{Kind: wire.KindHeartbeat, Heartbeat: wire.Heartbeat{Identity: id, Lease: lease}})
	require.NoError(t, err)
	idb, err := wire.AppendIdentity(nil, &id)
	require.NoError(t, err)
	lb := wire.AppendLease(nil, &lease)
	assert.Equal(t, frame[3:3+len(idb)+len(lb)], append(idb, lb...), "heartbeat = [1, 4, identity, lease, …]")

	var b []byte
	b = wire.AppendArrayHeader(b, 6)
	b = wire.AppendPoolID(b, &id.Pool)
	b = wire.AppendDomain(b, &id.Pool.Domain)
	b = wire.AppendFormat(b, &id.Format)
	b = wire.AppendNil(b)
	b = append(b, idb...)
	b = append(b, lb...)
	d := wire.NewDecoder(b)
	require.NoError(t, d.Array(6, "record"))
	p, err := d.PoolID()
	require.NoError(t, err)
	assert.Equal(t, id.Pool, p)
	dom, err := d.Domain()
	require.NoError(t, err)
	assert.Equal(t, id.Pool.Domain, dom)
	f, err := d.Format()
	require.NoError(t, err)
	assert.Equal(t, id.Format, f)
	assert.True(t, d.Nil())
	assert.False(t, d.Nil())
	gotID, err := d.Identity()
	require.NoError(t, err)
	assert.Equal(t, id, gotID)
	gotLease, err := d.Lease()
	require.NoError(t, err)
	assert.Equal(t, lease, gotLease)
	require.NoError(t, d.End())
}

func TestDecoder_ErrorsNameTheStandaloneField(t *testing.T) {
	id := recordIdentity()
	f := id.Format
	b := wire.AppendFormat(nil, &f)
	b[len(b)-1] = 0xd0  // slots_per_bucket: int8 …
	b = append(b, 0xff) // … -1
	_, err := wire.NewDecoder(b).Format()
	var de *wire.DecodeError
	require.ErrorAs(t, err, &de)
	assert.ErrorIs(t, err, wire.ErrMalformed)
	assert.Equal(t, "format.slots_per_bucket", de.Field)

	p := wire.AppendPoolID(nil, &id.Pool)
	_, err = wire.NewDecoder(p[:len(p)-1]).PoolID()
	assert.ErrorIs(t, err, wire.ErrTruncated)
	assert.ErrorIs(t, wire.NewDecoder(append(p, 0)).End(), wire.ErrTrailingBytes)
	_, err = wire.NewDecoder(wire.AppendUint(nil, 300)).Uint(255, "lane")
	require.ErrorAs(t, err, &de)
	assert.Equal(t, "lane", de.Field)
}

func TestDecoder_OffsetCountsConsumedBytes(t *testing.T) {
	b := wire.AppendUint(wire.AppendUint(wire.AppendUint(nil, 7), 300), 1<<40) // 1 + 3 + 9 bytes
	d := wire.NewDecoder(append(b, 0xc0))
	assert.Zero(t, d.Offset())
	for _, want := range []int{1, 4, 13} {
		_, err := d.Uint(math.MaxUint64, "v")
		require.NoError(t, err)
		assert.Equal(t, want, d.Offset())
	}
	_, err := d.Uint(math.MaxUint64, "v")
	require.Error(t, err, "nil is not an integer")
	assert.Equal(t, 13, d.Offset(), "a failed read consumes nothing")
}
