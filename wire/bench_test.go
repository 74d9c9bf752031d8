package wire_test

import (
	"fmt"
	"testing"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire"
	"github.com/stretchr/testify/require"
)

var sinkBytes []byte

func benchFrames() map[string]wire.Frame {
	// An 8 MiB snapshot is 1,048,576 words; one chunk at a 16 MiB limit.
	words := make([]uint64, 1<<20)
	for i := range words {
		words[i] = uint64(i) * 0x9E3779B97F4A7C15
	}
	images := make([]ckf.BucketImage, 64)
	for i := range images {
		images[i] = ckf.BucketImage{Bucket: uint32(i * 977), Word: uint64(i) * 0xBF58476D1CE4E5B9}
	}
	id, lease := testIdentity(), testLease()
	return map[string]wire.Frame{
		"snapshot=8MiB": {Kind: wire.KindSnapshotChunk, Snapshot: wire.SnapshotChunk{Identity: id, Lease: lease, Sequence: 1, ChunkCount: 1, Words: words}},
		"delta=64":      {Kind: wire.KindDelta, Delta: ckf.Delta{Identity: id, Lease: lease, BaseSequence: 1, Sequence: 2, Images: images}},
	}
}

func BenchmarkFrameEncode(b *testing.B) {
	for _, name := range []string{"snapshot=8MiB", "delta=64"} {
		f := benchFrames()[name]
		b.Run(name, func(b *testing.B) {
			buf, _ := wire.AppendFrame(nil, &f)
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			for b.Loop() {
				buf, _ = wire.AppendFrame(buf[:0], &f)
			}
			sinkBytes = buf
		})
	}
}

func BenchmarkFrameDecode(b *testing.B) {
	for _, name := range []string{"snapshot=8MiB", "delta=64"} {
		f := benchFrames()[name]
		buf, _ := wire.AppendFrame(nil, &f)
		for _, mode := range []string{"copy", "view"} {
			decode := wire.DecodeFrame
			if mode == "view" {
				decode = wire.DecodeFrameView
			}
			b.Run(name+"/"+mode, func(b *testing.B) {
				var out wire.Frame
				require.NoError(b, decode(buf, &out))
				b.SetBytes(int64(len(buf)))
				b.ReportAllocs()
				for b.Loop() {
					if err := decode(buf, &out); err != nil {
						require.Fail(b, fmt.Sprint(err))
					}
				}
			})
		}
	}
}
