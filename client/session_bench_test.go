package client

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wire"
)

// BenchmarkSessionApply prices the session gate: a one-image delta applied
// straight to the consumer (gate=off) and through a Session (gate=on, the
// header decode and lease check on every frame).
func BenchmarkSessionApply(b *testing.B) {
	for _, gate := range []string{"off", "on"} {
		b.Run("gate="+gate, func(b *testing.B) {
			m := consumer.Manifest{ConsumerInstance: testConsumer, Domain: testDomain, Format: testFormat, VerificationWindow: 2}
			m.Lanes[0] = &testPool
			n, err := NewNative(m)
			require.NoError(b, err)
			s := NewSession(n, lease(1))
			var raw []byte
			snap := snapshotOn(0, testID, 1, 1, words(1))
			raw, err = wire.AppendFrame(nil, &wire.Frame{Kind: wire.KindSnapshotChunk, Snapshot: wire.SnapshotChunk{
				Identity: snap.Identity, Lease: snap.Lease, Sequence: 1, ChunkCount: 1, Words: snap.Words}})
			require.NoError(b, err)
			_, err = s.Apply(raw)
			require.NoError(b, err)
			frames := make([][]byte, b.N)
			for i := range frames {
				seq := uint64(i) + 1
				frames[i], err = wire.AppendFrame(nil, &wire.Frame{Kind: wire.KindDelta, Delta: ckf.Delta{Identity: testID, Lease: lease(1),
					BaseSequence: seq, Sequence: seq + 1, Images: []ckf.BucketImage{{Bucket: uint32(i % 64), Word: seq}}}})
				require.NoError(b, err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if gate == "on" {
					_, err = s.Apply(frames[i])
				} else {
					_, err = n.ApplyFrame(frames[i])
				}
				if err != nil {
					require.Fail(b, "apply", "%v", err)
				}
			}
		})
	}
}
