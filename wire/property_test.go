package wire_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire"
	"pgregory.net/rapid"
)

func genIdentity(t *rapid.T) ckf.ProducerIdentity {
	var id ckf.ProducerIdentity
	copy(id.Pool.Domain.CacheSemantics.Digest[:], rapid.SliceOfN(rapid.Byte(), 16, 16).Draw(t, "sem"))
	copy(id.Pool.Domain.RoutingScope.Digest[:], rapid.SliceOfN(rapid.Byte(), 16, 16).Draw(t, "scope"))
	id.Pool.Domain.CacheSemantics.Source = ckf.DigestSource(rapid.IntRange(0, 1).Draw(t, "semsrc"))
	id.Pool.Domain.RoutingScope.Source = ckf.DigestSource(rapid.IntRange(0, 1).Draw(t, "scopesrc"))
	id.Pool.DCID = rapid.Uint64().Draw(t, "dc")
	id.ProducerIncarnation = rapid.Uint64().Draw(t, "inc")
	id.LayoutGeneration = rapid.Uint64().Draw(t, "gen")
	id.Format = ckf.Format{
		Version: rapid.Uint8().Draw(t, "ver"), Seed: rapid.Uint64().Draw(t, "seed"),
		BucketCount: rapid.Uint64().Draw(t, "bc"), FingerprintBits: rapid.Uint8().Draw(t, "fp"),
		SlotsPerBucket: rapid.Uint8().Draw(t, "slots"),
	}
	return id
}

func genLease(t *rapid.T) ckf.LaneLease {
	return ckf.LaneLease{ConsumerInstance: rapid.Uint64().Draw(t, "ci"), PhysicalLane: rapid.Uint8().Draw(t, "lane"), AssignmentEpoch: rapid.Uint64().Draw(t, "epoch")}
}

func genFrame(t *rapid.T) wire.Frame {
	switch k := wire.Kind(rapid.IntRange(1, 5).Draw(t, "kind")); k {
	case wire.KindSnapshotChunk:
		count := rapid.Uint32Range(1, 1<<32-1).Draw(t, "count")
		words := rapid.SliceOfN(rapid.Uint64(), 0, 300).Draw(t, "words")
		return wire.Frame{Kind: k, Snapshot: wire.SnapshotChunk{
			Identity: genIdentity(t), Lease: genLease(t), Sequence: rapid.Uint64().Draw(t, "seq"),
			ChunkIndex: rapid.Uint32Range(0, count-1).Draw(t, "index"), ChunkCount: count,
			BucketOffset: rapid.Uint64Range(0, 1<<63).Draw(t, "offset"), Words: words,
		}}
	case wire.KindDelta:
		images := rapid.SliceOfN(rapid.Custom(func(t *rapid.T) ckf.BucketImage {
			return ckf.BucketImage{Bucket: rapid.Uint32().Draw(t, "b"), Word: rapid.Uint64().Draw(t, "w")}
		}), 0, 100).Draw(t, "images")
		return wire.Frame{Kind: k, Delta: ckf.Delta{
			Identity: genIdentity(t), Lease: genLease(t),
			BaseSequence: rapid.Uint64().Draw(t, "base"), Sequence: rapid.Uint64().Draw(t, "seq"), Images: images,
		}}
	case wire.KindDrainMarker:
		return wire.Frame{Kind: k, Drain: ckf.DrainMarker{Lease: genLease(t), ExpectedSequence: rapid.Uint64().Draw(t, "exp")}}
	case wire.KindHeartbeat:
		return wire.Frame{Kind: k, Heartbeat: wire.Heartbeat{
			Identity: genIdentity(t), Lease: genLease(t), LastSequence: rapid.Uint64().Draw(t, "last"), UnixMicros: rapid.Int64().Draw(t, "us"),
		}}
	default:
		return wire.Frame{Kind: k, Close: wire.Close{
			Reason:  wire.CloseReason(rapid.SampledFrom([]string{"shutting_down", "lagged", "producer_changed", "fenced", "invalid_request", "", "x"}).Draw(t, "reason")),
			Message: rapid.String().Draw(t, "msg"),
		}}
	}
}

// TestFrame_RoundTripProperty: any frame survives encode → stream → decode,
// through one reused Frame, and every strict prefix of an encoding fails
// with an error instead of decoding to something else.
func TestFrame_RoundTripProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		frames := rapid.SliceOfN(rapid.Custom(genFrame), 1, 8).Draw(t, "frames")
		var buf bytes.Buffer
		w := wire.NewWriter(&buf, 0)
		for i := range frames {
			require.NoError(t, w.WriteFrame(&frames[i]), "WriteFrame")
		}
		r := wire.NewReader(&buf, 0)
		var got wire.Frame
		for i := range frames {
			require.NoError(t, r.ReadFrame(&got), "frame %d", i)
			g, w := got, frames[i]
			require.True(t, sameFrame(&g, &w), "frame %d:\ngot  %+v\nwant %+v", i, g, w)
		}
		b, _ := wire.AppendFrame(nil, &frames[0])
		cut := rapid.IntRange(0, len(b)-1).Draw(t, "cut")
		require.Error(t, wire.DecodeFrame(b[:cut], &got), "prefix of %d/%d bytes decoded without error", cut, len(b))
	})
}

func sameFrame(g, w *wire.Frame) bool {
	if g.Kind != w.Kind {
		return false
	}
	switch w.Kind {
	case wire.KindSnapshotChunk:
		a, b := g.Snapshot, w.Snapshot
		aw, bw := a.Words, b.Words
		a.Words, b.Words = nil, nil
		return deepEqual(a, b) && len(aw) == len(bw) && (len(aw) == 0 || deepEqual(aw, bw))
	case wire.KindDelta:
		a, b := g.Delta, w.Delta
		ai, bi := a.Images, b.Images
		a.Images, b.Images = nil, nil
		return deepEqual(a, b) && len(ai) == len(bi) && (len(ai) == 0 || deepEqual(ai, bi))
	case wire.KindDrainMarker:
		return g.Drain == w.Drain
	case wire.KindHeartbeat:
		return g.Heartbeat == w.Heartbeat
	}
	return g.Close == w.Close
}
