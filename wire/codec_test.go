package wire_test

import (
	"bytes"
	"encoding/hex"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire"
	"github.com/vmihailenco/msgpack/v5"
)

func testIdentity() ckf.ProducerIdentity {
	var id ckf.ProducerIdentity
	for i := range id.Pool.Domain.CacheSemantics.Digest {
		id.Pool.Domain.CacheSemantics.Digest[i] = byte(i + 1)
		id.Pool.Domain.RoutingScope.Digest[i] = byte(0xa0 + i)
	}
	id.Pool.Domain.CacheSemantics.Source = ckf.DigestExplicit
	id.Pool.Domain.RoutingScope.Source = ckf.DigestDefaultDerived
	id.Pool.DCID = 7
	id.ProducerIncarnation = 0x1122334455667788
	id.LayoutGeneration = 3
	id.Format = ckf.NewFormat(0x5DEECE66D1B54A33, 1024)
	return id
}

func testLease() ckf.LaneLease {
	return ckf.LaneLease{ConsumerInstance: 42, PhysicalLane: 5, AssignmentEpoch: 9}
}

func sampleFrames() map[string]wire.Frame {
	id, lease := testIdentity(), testLease()
	return map[string]wire.Frame{
		"snapshot_chunk": {Kind: wire.KindSnapshotChunk, Snapshot: wire.SnapshotChunk{
			Identity: id, Lease: lease, Sequence: 17, ChunkIndex: 1, ChunkCount: 3, BucketOffset: 4,
			Words: []uint64{0, 1, 0xFFFFFFFFFFFFFFFF, 0x0123456789ABCDEF},
		}},
		"delta": {Kind: wire.KindDelta, Delta: ckf.Delta{
			Identity: id, Lease: lease, BaseSequence: 17, Sequence: 18,
			Images: []ckf.BucketImage{{Bucket: 3, Word: 0xABCD}, {Bucket: 1023, Word: 0}},
		}},
		"drain_marker": {Kind: wire.KindDrainMarker, Drain: ckf.DrainMarker{Lease: lease, ExpectedSequence: 18}},
		"heartbeat": {Kind: wire.KindHeartbeat, Heartbeat: wire.Heartbeat{
			Identity: id, Lease: lease, LastSequence: 18, UnixMicros: -5,
		}},
		"close":         {Kind: wire.KindClose, Close: wire.Close{Reason: wire.CloseLagged, Message: "queue full"}},
		"close_unknown": {Kind: wire.KindClose, Close: wire.Close{Reason: "future_reason", Message: ""}},
	}
}

// frameEqual compares the field f.Kind selects.
func frameEqual(t *testing.T, got, want *wire.Frame) {
	t.Helper()
	require.Equal(t, want.Kind, got.Kind, "kind: got %v, want %v", got.Kind, want.Kind)
	var g, w any
	switch want.Kind {
	case wire.KindSnapshotChunk:
		g, w = got.Snapshot, want.Snapshot
		if len(got.Snapshot.Words) == 0 && len(want.Snapshot.Words) == 0 {
			g2, w2 := got.Snapshot, want.Snapshot
			g2.Words, w2.Words = nil, nil
			g, w = g2, w2
		}
	case wire.KindDelta:
		g, w = got.Delta, want.Delta
		if len(got.Delta.Images) == 0 && len(want.Delta.Images) == 0 {
			g2, w2 := got.Delta, want.Delta
			g2.Images, w2.Images = nil, nil
			g, w = g2, w2
		}
	case wire.KindDrainMarker:
		g, w = got.Drain, want.Drain
	case wire.KindHeartbeat:
		g, w = got.Heartbeat, want.Heartbeat
	case wire.KindClose:
		g, w = got.Close, want.Close
	}
	require.Equal(t, w, g, "frame")
}

func TestFrame_RoundTrip(t *testing.T) {
	for name, f := range sampleFrames() {
		t.Run(name, func(t *testing.T) {
			b, err := wire.AppendFrame(nil, &f)
			require.NoError(t, err, "AppendFrame")
			var got wire.Frame
			require.NoError(t, wire.DecodeFrame(b, &got), "DecodeFrame")
			frameEqual(t, &got, &f)
			// Re-encoding gives the same bytes (canonical form).
			b2, err := wire.AppendFrame(nil, &got)
			require.NoError(t, err, "re-encode")
			require.Equal(t, b, b2, "re-encode")
			// The bytes are plain msgpack: a generic decoder reads them too.
			var generic []any
			require.NoError(t, msgpack.Unmarshal(b, &generic), "vmihailenco/msgpack cannot read the frame")
			v, _ := generic[0].(int8)
			assert.Equal(t, int8(1), v, "generic[0]: got %#v, want 1", generic[0])
		})
	}
}

func TestAppendFrame_Appends(t *testing.T) {
	f := sampleFrames()["drain_marker"]
	prefix := []byte("xyz")
	b, err := wire.AppendFrame(prefix, &f)
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(b, prefix), "got %x, want prefix %x", b, prefix)
	var got wire.Frame
	require.NoError(t, wire.DecodeFrame(b[3:], &got))
	frameEqual(t, &got, &f)
}

// Golden vectors pin the exact bytes of every kind. The drain marker is
// checked by hand below; the others were produced by AppendFrame and checked
// field by field against docs/wire.md.
var goldenFrames = map[string]string{
	"drain_marker": "940103932a050912",
	"close":        "940105a66c6167676564aa71756575652066756c6c",
	"delta": "97010294" + goldenIdentity + goldenLease + "1112" +
		"c418" + "03000000" + "cdab000000000000" + "ff030000" + "0000000000000000",
	"snapshot_chunk": "99010194" + goldenIdentity + goldenLease + "11010304" +
		"c420" + "0000000000000000" + "0100000000000000" + "ffffffffffffffff" + "efcdab8967452301",
	"heartbeat": "96010494" + goldenIdentity + goldenLease + "12fb",
}

// identity = [pool_id, incarnation, layout_generation, format], without its
// 0x94 array header (part of each frame string above).
const goldenIdentity = "95" +
	"c410" + "0102030405060708090a0b0c0d0e0f10" + "01" +
	"c410" + "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf" + "00" + "07" +
	"cf1122334455667788" + "03" +
	"95" + "01" + "cf5deece66d1b54a33" + "cd0400" + "10" + "04"

const goldenLease = "932a0509"

func TestFrame_Golden(t *testing.T) {
	frames := sampleFrames()
	for name, hexWant := range goldenFrames {
		t.Run(name, func(t *testing.T) {
			f := frames[name]
			b, err := wire.AppendFrame(nil, &f)
			require.NoError(t, err)
			{
				got := hex.EncodeToString(b)
				require.Equal(t, hexWant, got, "bytes:\ngot  %s\nwant %s", got, hexWant)
			}
			want, _ := hex.DecodeString(hexWant)
			var got wire.Frame
			require.NoError(t, wire.DecodeFrame(want, &got))
			frameEqual(t, &got, &f)
		})
	}
}

// TestFrame_GoldenByHand spells the drain marker out byte by byte.
func TestFrame_GoldenByHand(t *testing.T) {
	want := []byte{
		0x94, // fixarray of 4: [version, kind, lease, expected_sequence]
		0x01, // version 1
		0x03, // kind 3 = drain marker
		0x93, // lease = fixarray of 3
		0x2a, //   consumer_instance 42
		0x05, //   physical_lane 5
		0x09, //   assignment_epoch 9
		0x12, // expected_sequence 18
	}
	f := sampleFrames()["drain_marker"]
	got, err := wire.AppendFrame(nil, &f)
	require.NoError(t, err)
	require.Equal(t, want, got)
}

func TestDecodeFrame_AcceptsAnyIntegerWidth(t *testing.T) {
	// The drain marker with every integer widened: int64 42, uint16 5,
	// uint32 9, int8 18.
	b := []byte{0x94, 0xd3, 0, 0, 0, 0, 0, 0, 0, 1, 0xcc, 3, 0x93,
		0xd3, 0, 0, 0, 0, 0, 0, 0, 42, 0xcd, 0, 5, 0xce, 0, 0, 0, 9, 0xd0, 18}
	var got wire.Frame
	require.NoError(t, wire.DecodeFrame(b, &got))
	want := sampleFrames()["drain_marker"]
	frameEqual(t, &got, &want)
}

func TestDecodeFrame_ReusesBuffers(t *testing.T) {
	frames := sampleFrames()
	snap, delta := frames["snapshot_chunk"], frames["delta"]
	sb, _ := wire.AppendFrame(nil, &snap)
	db, _ := wire.AppendFrame(nil, &delta)
	var f wire.Frame
	require.NoError(t, wire.DecodeFrame(sb, &f))
	require.NoError(t, wire.DecodeFrame(db, &f))
	allocs := testing.AllocsPerRun(100, func() {
		require.NoError(t, wire.DecodeFrame(sb, &f))
		require.NoError(t, wire.DecodeFrame(db, &f))
	})
	require.Equal(t, float64(0), allocs, "allocs per decode pair: got %v, want 0", allocs)
	frameEqual(t, &f, &delta)
	// Payload aliases the input.
	p := f.Payload()
	require.False(t, len(p) != 24 || &p[0] != &db[len(db)-24], "Payload: got %d bytes not aliasing the input", len(p))
}

func TestDecodeFrameView_LeavesPayload(t *testing.T) {
	snap := sampleFrames()["snapshot_chunk"]
	b, _ := wire.AppendFrame(nil, &snap)
	var f wire.Frame
	require.NoError(t, wire.DecodeFrameView(b, &f))
	require.Empty(t, f.Snapshot.Words, "Words: got %d, want 0", len(f.Snapshot.Words))
	want := b[len(b)-32:]
	require.Equal(t, want, f.Payload(), "Payload: got %x, want %x", f.Payload(), want)
}

func TestAppendFrame_Errors(t *testing.T) {
	id := testIdentity()
	badSource := id
	badSource.Pool.Domain.RoutingScope.Source = 2
	tests := []struct {
		name string
		f    wire.Frame
	}{
		{"zero kind", wire.Frame{}},
		{"unknown kind", wire.Frame{Kind: 9}},
		{"chunk count zero", wire.Frame{Kind: wire.KindSnapshotChunk, Snapshot: wire.SnapshotChunk{Identity: id}}},
		{"chunk index past count", wire.Frame{Kind: wire.KindSnapshotChunk, Snapshot: wire.SnapshotChunk{Identity: id, ChunkIndex: 2, ChunkCount: 2}}},
		{"offset overflow", wire.Frame{Kind: wire.KindSnapshotChunk, Snapshot: wire.SnapshotChunk{Identity: id, ChunkCount: 1, BucketOffset: math.MaxUint64, Words: []uint64{1}}}},
		{"digest source", wire.Frame{Kind: wire.KindDelta, Delta: ckf.Delta{Identity: badSource}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := []byte{1, 2}
			got, err := wire.AppendFrame(dst, &tt.f)
			require.ErrorIs(t, err, wire.ErrInvalidFrame)
			require.Equal(t, dst, got, "dst: got %x, want unchanged %x", got, dst)
		})
	}
}
