package conformance_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/internal/integration/conformance"
	"github.com/ckfrelay/ckfrelay/wasm/abi"
	"github.com/ckfrelay/ckfrelay/wasm/host"
	"github.com/ckfrelay/ckfrelay/wire"
)

// errClass is what a router branches on: the ABI code of the consumer or
// wire error and the session's own end causes.
type errClass struct {
	Code                             abi.Code
	Protocol, Lost, Deact, Closed, E bool
}

func classify(err error) errClass {
	return errClass{Code: abi.CodeOf(err), Protocol: errors.Is(err, client.ErrProtocol), Lost: errors.Is(err, client.ErrLeaseLost),
		Deact: errors.Is(err, client.ErrDeactivated), Closed: errors.Is(err, client.ErrStreamClosed), E: err != nil}
}

// FuzzSession_NativeMatchesWasm drives one frame stream per lane through
// the router's session gate (client.Session) over the native consumer and
// over the WebAssembly module in lockstep: frames drawn from the fuzz input
// (snapshot chunks, deltas, heartbeats, drain markers, close frames and raw
// bytes, under the carrying session's lease, the other lane's, or a guessed
// one), sessions restarted under new epochs. After every frame the results,
// the error classes, both lanes' status and words must agree, and the
// module must never trap.
func FuzzSession_NativeMatchesWasm(f *testing.F) {
	ctx := context.Background()
	rt, err := host.NewRuntime(ctx, host.NewConfig().WithCompilationCacheDir(cacheDir()))
	require.NoError(f, err)
	f.Cleanup(func() { rt.Close(ctx) })
	fx, err := conformance.NewFixture(64, 2)
	require.NoError(f, err)
	buckets := fx.Manifest.Format.BucketCount
	f.Add([]byte{0, 0, 1, 0, 0, 0, 0, 0, 2, 0, 1, 3, 3, 0, 1})
	f.Add([]byte{0, 1, 1, 1, 5, 0, 0, 9, 2, 4, 2, 5, 1, 1, 7, 3, 5, 5, 4, 0, 1, 6, 9, 9, 9})
	f.Add([]byte{0, 0, 0, 1, 1, 0, 0, 1, 8, 3, 2, 0, 0, 0, 1, 2, 4, 0, 2, 7, 1, 1})
	// One consumer of each kind for the whole run (instantiating the module
	// per input would cost most of the time): every input retires both
	// lanes and opens its sessions above every epoch used before.
	n, err := client.NewNative(fx.Manifest)
	require.NoError(f, err)
	in, err := rt.NewInstance(ctx, fx.Manifest)
	require.NoError(f, err)
	f.Cleanup(func() { in.Close() })
	var epochs [2]uint64
	f.Fuzz(func(t *testing.T, data []byte) {
		for l := range 2 {
			require.Equal(t, classify(n.Retire(l)), classify(in.Retire(l)), "retire %d", l)
		}
		next := func() byte {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return b
		}
		var sn, sw [2]*client.Session
		open := func(l int) {
			epochs[l]++
			sn[l], sw[l] = client.NewSession(n, fx.Lease(l, epochs[l])), client.NewSession(in, fx.Lease(l, epochs[l]))
		}
		open(0)
		open(1)
		for steps := 0; len(data) > 0 && steps < 64; steps++ {
			op, a, b := next()%8, next(), next()
			stream := int(a) % 2
			if op == 0 {
				open(stream)
				continue
			}
			// The frame's lease: the stream's own, the other lane's, or a
			// guessed epoch on the stream's lane.
			target := stream
			if a&2 != 0 {
				target = 1 - stream
			}
			l := fx.Lease(target, epochs[target])
			if a&4 != 0 {
				l.AssignmentEpoch += uint64(b%3) + 1
			}
			id := fx.Identity(target)
			seq := uint64(b % 8)
			var fr wire.Frame
			raw := []byte(nil)
			switch op {
			case 1: // a chunk: index, count and length from the input, words from the fixture
				count := uint32(next()%3) + 1
				index := uint32(next()) % count
				per := (buckets + uint64(count) - 1) / uint64(count)
				off := uint64(index) * per
				words := fx.Words(target)[off:min(buckets, off+per)]
				fr = wire.Frame{Kind: wire.KindSnapshotChunk, Snapshot: wire.SnapshotChunk{Identity: id, Lease: l, Sequence: seq,
					ChunkIndex: index, ChunkCount: count, BucketOffset: off, Words: words}}
			case 2:
				fr = wire.Frame{Kind: wire.KindDelta, Delta: ckf.Delta{Identity: id, Lease: l, BaseSequence: seq, Sequence: seq + uint64(next()%2),
					Images: []ckf.BucketImage{{Bucket: uint32(next()) % uint32(buckets+1), Word: uint64(next()) * 0x9E3779B97F4A7C15}}}}
			case 3:
				fr = wire.Frame{Kind: wire.KindHeartbeat, Heartbeat: wire.Heartbeat{Identity: id, Lease: l, LastSequence: seq}}
			case 4:
				fr = wire.Frame{Kind: wire.KindDrainMarker, Drain: ckf.DrainMarker{Lease: l, ExpectedSequence: seq}}
			case 5:
				fr = wire.Frame{Kind: wire.KindClose, Close: wire.Close{Reason: wire.CloseFenced}}
			case 6: // the stream's whole snapshot, chunk by chunk, as a relay sends it
				frames, err := fx.Subscribe(stream, fx.Lease(stream, epochs[stream]), wire.MaxSnapshotChunkOverhead+8*int(1+b%32))
				require.NoError(t, err)
				for _, raw := range frames {
					compare(t, n, in, sn[stream], sw[stream], raw)
				}
				continue
			default: // raw bytes
				raw = append([]byte{}, data[:min(len(data), int(b%24))]...)
				data = data[len(raw):]
			}
			if raw == nil {
				raw, err = wire.AppendFrame(nil, &fr)
				require.NoError(t, err, "%v", fr.Kind)
			}
			compare(t, n, in, sn[stream], sw[stream], raw)
		}
	})
}

// compare applies raw through both sessions and checks they agree.
func compare(t *testing.T, n *client.Native, in *host.Instance, sn, sw *client.Session, raw []byte) {
	t.Helper()
	rn, errN := sn.Apply(raw)
	rw, errW := sw.Apply(raw)
	require.Zero(t, in.Resets(), "the module trapped: %v", errW)
	require.Equal(t, rn, rw, "result: native (want), wasm (got)")
	require.Equal(t, classify(errN), classify(errW), "native error %v, wasm error %v", errN, errW)
	for l := range 2 {
		stN, errN := n.LaneStatus(l)
		stW, errW := in.LaneStatus(l)
		require.NoError(t, errN)
		require.NoError(t, errW)
		require.Equal(t, stN, stW, "lane %d status: native (want), wasm (got)", l)
		wn, errN := n.AppendLaneWords(nil, l)
		ww, errW := in.AppendLaneWords(nil, l)
		require.Equal(t, classify(errN), classify(errW), "lane %d words: native error %v, wasm error %v", l, errN, errW)
		require.Equal(t, wn, ww, "lane %d words: native (want), wasm (got)", l)
	}
}
