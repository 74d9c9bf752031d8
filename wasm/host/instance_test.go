package host_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/internal/integration/conformance"
	"github.com/ckfrelay/ckfrelay/wasm/abi"
	"github.com/ckfrelay/ckfrelay/wasm/host"
)

const blockSize = 4

func tokens(base uint32, blocks int) []uint32 {
	t := make([]uint32, blocks*blockSize)
	for i := range t {
		t[i] = base + uint32(i)*2654435761
	}
	return t
}

// readyPair returns a fixture with lanes 0..lanes-1 stored and snapshotted
// into both a native consumer and a wasm instance.
func readyPair(t testing.TB, rt *host.Runtime, lanes int) (*conformance.Fixture, *client.Native, *host.Instance) {
	t.Helper()
	fx, err := conformance.NewFixture(200, lanes)
	require.NoError(t, err)
	n, err := client.NewNative(fx.Manifest)
	require.NoError(t, err)
	in, err := rt.NewInstance(context.Background(), fx.Manifest)
	require.NoError(t, err)
	t.Cleanup(func() { in.Close() })
	for l := range lanes {
		fx.Store(l, tokens(uint32(l)*1000, 3+l), blockSize)
		for _, c := range []client.Lanes{n, in} {
			require.NoError(t, c.Assign(fx.Identity(l), fx.Lease(l, 1)))
		}
		frames, err := fx.Subscribe(l, fx.Lease(l, 1), 0)
		require.NoError(t, err)
		for _, f := range frames {
			for _, c := range []client.Lanes{n, in} {
				r, err := c.ApplyFrame(f)
				require.NoError(t, err, "snapshot")
				require.Equal(t, consumer.SnapshotInstalled, r.Outcome, "snapshot: %v", r)
			}
		}
	}
	return fx, n, in
}

// TestInstance_ResetAfterTrap makes the guest run out of its memory limit
// (a Go fatal error, which no recover catches) and checks the instance comes
// back configured, every lane unassigned, and epochs still monotone.
func TestInstance_ResetAfterTrap(t *testing.T) {
	rt := newRuntime(t, host.NewConfig().WithMemoryLimitPages(512)) // 32 MiB
	fx, _, in := readyPair(t, rt, 2)
	require.NoError(t, in.Assign(fx.Identity(1), fx.Lease(1, 7)))
	_, err := in.ApplyFrame(make([]byte, 40<<20)) // the input buffer alone exceeds the limit
	require.ErrorIs(t, err, host.ErrInstanceReset)
	assert.Equal(t, 1, in.Resets(), "Resets()")
	for l, epoch := range []uint64{1, 7} {
		s, err := in.LaneStatus(l)
		require.NoError(t, err)
		assert.True(t, s.Configured, "lane %d after reset: configured", l)
		assert.False(t, s.Assigned, "lane %d after reset: assigned", l)
		assert.False(t, s.Ready, "lane %d after reset: ready", l)
		assert.Equal(t, epoch, s.LastEpoch, "lane %d after reset: last epoch", l)
		assert.ErrorIs(t, in.Assign(fx.Identity(l), fx.Lease(l, epoch)), consumer.ErrStaleAssignmentEpoch, "lane %d: re-assign epoch %d", l, epoch)
	}
	assert.NoError(t, in.Assign(fx.Identity(1), fx.Lease(1, 8)), "assign a newer epoch after reset")
	_, err = in.Stats()
	assert.NoError(t, err, "stats after reset")
}

// TestInstance_hammer runs queries from several goroutines while one
// goroutine applies heartbeats; every query must see the snapshot's depths.
func TestInstance_hammer(t *testing.T) {
	defer runtime.GOMAXPROCS(max(runtime.GOMAXPROCS(0)/2, 1)) // restore on exit
	rt := newRuntime(t, host.NewConfig())
	fx, n, in := readyPair(t, rt, 3)
	req := tokens(1000, 5) // lane 1's stored request
	var want consumer.QueryResult
	require.NoError(t, n.QueryTokens(req, blockSize, 1337, &want))
	want.Probes = 0
	hb, err := fx.DrainFrame(0)
	require.NoError(t, err)
	const P, N = 4, 200
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, P+1)
	for range P {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var got consumer.QueryResult
			for range N {
				if err := in.QueryTokens(req, blockSize, 1337, &got); err != nil {
					errs <- err
					return
				}
				got.Probes = 0
				if got != want {
					errs <- errors.New("query result differs from native")
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-start
		for range N {
			if r, err := in.ApplyFrame(hb); err != nil || r.Outcome != consumer.DrainAcknowledged {
				errs <- errors.New("drain marker not acknowledged")
				return
			}
		}
	}()
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
}

// FuzzInstance_MatchesNative applies arbitrary bytes as a frame (raw, or
// spliced into a real delta) to the wasm instance and the native consumer:
// neither may trap, results and errors must agree, and a frame that was not
// applied must leave every lane's words unchanged.
func FuzzInstance_MatchesNative(f *testing.F) {
	rt := newRuntime(f, host.NewConfig())
	fx, n, in := readyPair(f, rt, 2)
	fx.Store(0, tokens(77, 4), blockSize)
	_, deltas := fx.Deltas(0)
	drain, _ := fx.DrainFrame(1)
	for _, d := range append(deltas, drain) {
		f.Add(d, uint16(0), false)
		f.Add(d, uint16(len(d)/2), true)
	}
	f.Add([]byte{0x93, 1, 9}, uint16(0), false)
	base := deltas[0]
	f.Fuzz(func(t *testing.T, data []byte, at uint16, splice bool) {
		frame := data
		if splice {
			// Overwrite part of a real delta so the fuzzer reaches the
			// lane rules, not only the decoder.
			frame = append([]byte(nil), base...)
			copy(frame[int(at)%len(frame):], data)
		}
		var before [2][]uint64
		for l := range before {
			before[l], _ = in.AppendLaneWords(nil, l)
		}
		rn, errN := n.ApplyFrame(frame)
		rw, errW := in.ApplyFrame(frame)
		require.Zero(t, in.Resets(), "the instance trapped: %v", errW)
		require.Equal(t, rn, rw, "result: native (want), wasm (got)")
		require.Equal(t, errN == nil, errW == nil, "native error %v, wasm error %v", errN, errW)
		if errN != nil {
			require.ErrorIs(t, errW, errors.Unwrap(errN), "native error %v, wasm error %v: different sentinels", errN, errW)
		}
		for l := range before {
			wn, _ := n.AppendLaneWords(nil, l)
			ww, _ := in.AppendLaneWords(nil, l)
			require.Equal(t, wn, ww, "lane %d words: native (want), wasm (got)", l)
			changed := rw.Outcome == consumer.Applied || rw.Outcome == consumer.SnapshotInstalled ||
				rw.Outcome == consumer.SnapshotChunkAccepted
			if !changed || rw.Lane != l {
				require.Equal(t, before[l], ww, "lane %d words changed by a frame with outcome %v on lane %d", l, rw.Outcome, rw.Lane)
			}
		}
	})
}

// FuzzInstance_Calls drives random calls (assign with arbitrary bytes as the
// lease fields, retire, queries of every kind with arbitrary arguments,
// status, contains) through the wasm instance and the native consumer in
// lockstep: no call may trap and every result must agree.
func FuzzInstance_Calls(f *testing.F) {
	rt := newRuntime(f, host.NewConfig())
	fx, n, in := readyPair(f, rt, 2)
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
	f.Add([]byte{3, 2, 200, 0, 0, 0, 1, 5, 255, 4, 17, 9})
	f.Fuzz(func(t *testing.T, data []byte) {
		next := func() byte {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return b
		}
		for len(data) > 0 {
			op, a, b := next()%6, next(), next()
			var gotN, gotW any
			switch op {
			case 0: // assign: lane a%20, epoch b, identity of lane a%2 or a foreign one
				id := fx.Identity(int(a) % 2)
				if b&0x80 != 0 {
					id.ProducerIncarnation = uint64(b)
				}
				l := fx.Lease(int(a)%20, uint64(b))
				errN, errW := n.Assign(id, l), in.Assign(id, l)
				gotN, gotW = errCode(errN), errCode(errW)
			case 1:
				errN, errW := n.Retire(int(a)-4), in.Retire(int(a)-4)
				gotN, gotW = errCode(errN), errCode(errW)
			case 2: // query of kind a%3 with b elements of arbitrary content
				var rn, rw consumer.QueryResult
				hs := make([]uint64, b%40)
				toks := make([]uint32, b)
				for i := range hs {
					hs[i] = uint64(next()) * 0x9E3779B97F4A7C15
				}
				for i := range toks {
					toks[i] = uint32(next())
				}
				var errN, errW error
				switch a % 3 {
				case 0:
					errN, errW = n.Query(hs, &rn), in.Query(hs, &rw)
				case 1:
					errN, errW = n.QuerySequenceHashes(hs, &rn), in.QuerySequenceHashes(hs, &rw)
				default:
					bs := int(int8(next()))
					errN, errW = n.QueryTokens(toks, bs, uint64(a), &rn), in.QueryTokens(toks, bs, uint64(a), &rw)
				}
				rn.Probes, rw.Probes = 0, 0
				gotN, gotW = []any{errCode(errN), rn}, []any{errCode(errW), rw}
			case 3:
				sn, errN := n.LaneStatus(int(a) - 2)
				sw, errW := in.LaneStatus(int(a) - 2)
				gotN, gotW = []any{errCode(errN), sn}, []any{errCode(errW), sw}
			case 4:
				h := uint64(a)<<8 | uint64(b)
				mn, errN := n.Contains(h)
				mw, errW := in.Contains(h)
				gotN, gotW = []any{errCode(errN), mn}, []any{errCode(errW), mw}
			case 5:
				sn, _ := n.Stats()
				sw, err := in.Stats()
				gotN, gotW = sn, sw
				if err != nil {
					gotW = err
				}
			}
			require.Zero(t, in.Resets(), "op %d trapped the instance", op)
			require.Equal(t, gotN, gotW, "op %d (%d, %d): native (want), wasm (got)", op, a, b)
		}
	})
}

// errCode is an error's ABI code: what both implementations must agree on.
func errCode(err error) abi.Code { return abi.CodeOf(err) }

// TestInstance_QueryTokensWithMatchesNative stores requests hashed with a
// namespace salt, multimodal hashes and Eagle windows, and checks the module
// answers QueryTokensWith exactly as the native consumer for each option
// set, and that each option changes the answer (the full depth only with the
// stored inputs).
func TestInstance_QueryTokensWithMatchesNative(t *testing.T) {
	rt := newRuntime(t, host.NewConfig())
	fx, n, in := readyPair(t, rt, 1)
	req := tokens(90000, 4)
	req = append(req, 17) // the Eagle window of the last block
	salt := ckf.Salt("", "tenant")
	stored := ckf.HashOptions{Eagle: true, MM: [][]uint64{nil, {11, 12}}}
	seq := ckf.AppendTokenSequenceHashesWith(nil, req, blockSize, salt, stored)
	require.Len(t, seq, 4)
	fx.StoreKeys(0, seq) // canonical keys as roots: the consumer finds them by seq
	frames, err := fx.Subscribe(0, fx.Lease(0, 2), 0)
	require.NoError(t, err)
	for _, c := range []client.Lanes{n, in} {
		require.NoError(t, c.Assign(fx.Identity(0), fx.Lease(0, 2)))
		for _, f := range frames {
			_, err := c.ApplyFrame(f)
			require.NoError(t, err)
		}
	}
	for _, tc := range []struct {
		name  string
		salt  uint64
		o     ckf.HashOptions
		depth uint32
	}{
		{"stored inputs", salt, stored, 4},
		{"mm in another order", salt, ckf.HashOptions{Eagle: true, MM: [][]uint64{nil, {12, 11}}}, 4},
		{"no namespace", ckf.BaseSalt, stored, 0},
		{"no mm", salt, ckf.HashOptions{Eagle: true}, 1},
		{"no eagle", salt, ckf.HashOptions{MM: stored.MM}, 0},
	} {
		var want, got consumer.QueryResult
		require.NoError(t, n.QueryTokensWith(req, blockSize, tc.salt, tc.o, &want), tc.name)
		require.NoError(t, in.QueryTokensWith(req, blockSize, tc.salt, tc.o, &got), tc.name)
		assert.Equal(t, want, got, tc.name)
		assert.Equal(t, tc.depth, got.Depths[0], tc.name)
	}
	var res consumer.QueryResult
	assert.ErrorIs(t, in.QueryTokensWith(req, 0, salt, stored, &res), consumer.ErrInvalidQuery, "block size 0")
}
