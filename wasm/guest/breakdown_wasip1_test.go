//go:build wasip1

package main

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wasm/abi"
	"github.com/ckfrelay/ckfrelay/wire"
)

func BenchmarkBreakdownGuest(b *testing.B) {
	const buckets = 4096
	f, _ := ckf.NewFilter(buckets, ckf.DefaultSeed, ckf.DefaultMaxKicks)
	rng := ckf.NewRNG(3)
	tokens := make([]uint32, 1024*16)
	for i := range tokens {
		tokens[i] = uint32(rng.Next())
	}
	seq := ckf.AppendSequenceHashes(nil, ckf.AppendLocalBlockHashes(nil, tokens, 16, ckf.BaseSalt))
	for _, h := range seq {
		require.NoError(b, f.Insert(h))
	}
	d := ckf.Domain{CacheSemantics: ckf.ScopedDigest{Digest: [16]byte{7}}}
	m := consumer.Manifest{ConsumerInstance: 1, Domain: d, Format: ckf.NewFormat(ckf.DefaultSeed, buckets), VerificationWindow: 2}
	var ids [16]ckf.ProducerIdentity
	for l := range 16 {
		p := ckf.PoolID{Domain: d, DCID: uint64(l)}
		m.Lanes[l] = &p
		ids[l] = ckf.ProducerIdentity{Pool: p, ProducerIncarnation: 1, LayoutGeneration: 1, Format: m.Format}
	}
	require.Equal(b, abi.OK, g.configure(abi.AppendManifest(nil, &m)))
	for l := range 16 {
		lease := ckf.LaneLease{ConsumerInstance: 1, PhysicalLane: uint8(l), AssignmentEpoch: 1}
		require.Equal(b, abi.OK, g.assign(abi.AppendAssignment(nil, &ids[l], &lease)))
		fr := wire.Frame{Kind: wire.KindSnapshotChunk, Snapshot: wire.SnapshotChunk{Identity: ids[l], Lease: lease, Sequence: 1, ChunkCount: 1, Words: f.Words()}}
		out, err := wire.AppendFrame(nil, &fr)
		require.NoError(b, err)
		require.Greater(b, g.apply(out), abi.Code(0))
	}
	in := heap.alloc(8 * 1024)
	copy(in, unsafe.Slice((*byte)(unsafe.Pointer(&seq[0])), 8*1024))
	out := heap.alloc(256)
	pin, pout := unsafe.Pointer(&in[0]), unsafe.Pointer(&out[0])
	for _, n := range []uint32{1, 1024} {
		b.Run("x=export"+itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				exportQuery(abi.QuerySequenceHashes, pin, n, 0, 0, pout)
			}
		})
		b.Run("x=guestquery"+itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				g.query(abi.QuerySequenceHashes, in[:8*n], int(n), 0, 0, out)
			}
		})
		b.Run("x=consumer"+itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = g.c.QuerySequenceHashes(seq[:n], &g.res)
			}
		})
	}
	hv := uint64s(in[:8*1024], &g.hashes)
	b.Run("x=consumerView1", func(b *testing.B) {
		for b.Loop() {
			_ = g.c.QuerySequenceHashes(hv[:1], &g.res)
		}
	})
	var res2 consumer.QueryResult
	b.Run("x=consumerLocalRes1", func(b *testing.B) {
		for b.Loop() {
			_ = g.c.QuerySequenceHashes(seq[:1], &res2)
		}
	})
	b.Run("x=guestquery1again", func(b *testing.B) {
		for b.Loop() {
			g.query(abi.QuerySequenceHashes, in[:8], 1, 0, 0, out)
		}
	})
	b.Run("x=consumer1again", func(b *testing.B) {
		for b.Loop() {
			_ = g.c.QuerySequenceHashes(seq[:1], &g.res)
		}
	})
	b.Run("x=exportNoDefer1024", func(b *testing.B) {
		for b.Loop() {
			exportQueryNoDefer(abi.QuerySequenceHashes, pin, 1024, 0, 0, pout)
		}
	})
	b.Run("x=exportNoView1024", func(b *testing.B) {
		for b.Loop() {
			exportQueryNoView(abi.QuerySequenceHashes, in[:8*1024], 1024, 0, 0, out)
		}
	})
	for _, v := range []int{0, 1, 2, 3} {
		b.Run("x=variant"+string(rune('0'+v)), func(b *testing.B) {
			for b.Loop() {
				g.queryVariant(v, in[:8], 1, out, seq[:1])
			}
		})
	}
	b.Run("x=views", func(b *testing.B) {
		for b.Loop() {
			view(pin, 8)
			view(pout, 80)
		}
	})
	b.Run("x=putrecord", func(b *testing.B) {
		for b.Loop() {
			abi.PutQueryRecord(out, &g.res)
		}
	})
	b.Run("x=putrecordLE", func(b *testing.B) {
		for b.Loop() {
			putQueryRecord(out, &g.res)
		}
	})
	b.Run("x=defer", func(b *testing.B) {
		for b.Loop() {
			withDefer()
		}
	})
	b.Run("x=nodefer", func(b *testing.B) {
		for b.Loop() {
			noDefer()
		}
	})
	b.Run("x=uint64s", func(b *testing.B) {
		for b.Loop() {
			_ = uint64s(in[:8*1024], &g.hashes)
		}
	})
	b.Run("x=queryNoConsumer", func(b *testing.B) {
		c := g.c
		g.c = nil
		for b.Loop() {
			g.query(abi.QuerySequenceHashes, in[:8], 1, 0, 0, out)
		}
		g.c = c
	})
	b.Run("x=contains", func(b *testing.B) {
		for b.Loop() {
			exportContains(seq[2])
		}
	})
}

func itoa(n uint32) string {
	if n == 1 {
		return "1"
	}
	return "1024"
}

//go:noinline
func withDefer() (code int32) {
	defer recovered(&code)
	return 0
}

//go:noinline
func noDefer() (code int32) {
	return 0
}

func exportQueryNoDefer(kind uint32, in unsafe.Pointer, count uint32, blockSize int32, salt uint64, out unsafe.Pointer) (code int32) {
	width := uint64(8)
	if kind == abi.QueryTokens {
		width = 4
	}
	src, ok := view(in, width*uint64(count))
	if !ok {
		return int32(g.fail(abi.ErrBadArgument, nil))
	}
	dst, ok := view(out, abi.QueryRecordSize)
	if !ok {
		return int32(g.fail(abi.ErrBadArgument, nil))
	}
	if kind > abi.QueryTokens {
		return int32(g.fail(abi.ErrBadArgument, nil))
	}
	return int32(g.query(int32(kind), src, int(count), int(blockSize), salt, dst))
}

func exportQueryNoView(kind uint32, src []byte, count uint32, blockSize int32, salt uint64, dst []byte) (code int32) {
	defer recovered(&code)
	if kind > abi.QueryTokens {
		return int32(g.fail(abi.ErrBadArgument, nil))
	}
	return int32(g.query(int32(kind), src, int(count), int(blockSize), salt, dst))
}

func (g *guest) queryVariant(v int, in []byte, count int, out []byte, seq []uint64) abi.Code {
	if g.c == nil {
		return g.fail(abi.ErrNotConfigured, nil)
	}
	var err error
	switch v {
	case 0:
		hashes := uint64s(in[:8*count], &g.hashes)
		err = g.c.QuerySequenceHashes(hashes, &g.res)
		putQueryRecord(out, &g.res)
	case 1:
		hashes := uint64s(in[:8*count], &g.hashes)
		err = g.c.QuerySequenceHashes(hashes, &g.res)
	case 2:
		err = g.c.QuerySequenceHashes(seq, &g.res)
		putQueryRecord(out, &g.res)
	case 3:
		err = g.c.QuerySequenceHashes(seq, &g.res)
	}
	if err != nil {
		return g.fail(abi.CodeOf(err), err)
	}
	return abi.Code(g.res.Mask)
}
