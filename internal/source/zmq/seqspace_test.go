package zmq

import (
	"encoding/binary"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/sim/engine"
)

func seqFrame(seq int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(seq)) }

func TestParseMessage_NegativeSequenceRejected(t *testing.T) {
	for _, seq := range []int64{-1, -2, math.MinInt64} {
		_, err := ParseMessage([][]byte{[]byte("kv"), seqFrame(seq), {0x90}})
		var de *DecodeError
		require.ErrorAs(t, err, &de, "seq %d", seq)
		assert.Equal(t, ReasonSequence, de.Reason)
	}
	m, err := ParseMessage([][]byte{[]byte("kv"), seqFrame(math.MaxInt64), {0x90}})
	require.NoError(t, err)
	assert.Equal(t, int64(math.MaxInt64), m.Seq)
}

func TestParseReplayReply_NegativeSequence(t *testing.T) {
	m, err := ParseReplayReply([][]byte{seqFrame(EndOfReplay), {}})
	require.NoError(t, err)
	assert.Equal(t, EndOfReplay, m.Seq)
	for _, seq := range []int64{-2, math.MinInt64} {
		_, err := ParseReplayReply([][]byte{seqFrame(seq), {0x90}})
		var de *DecodeError
		require.ErrorAs(t, err, &de, "seq %d", seq)
		assert.Equal(t, ReasonSequence, de.Reason)
	}
}

// A negative sequence on the PUB socket is rejected before admission and
// counted; the rank's stream is untouched.
func TestSource_NegativeSequenceRejected(t *testing.T) {
	pub, rep := endpoint(t, 1)
	e := startEngine(t, engine.Config{Endpoint: pub, Replay: rep})
	hs := newHarness(t, Config{Endpoint: pub, Replay: rep, Worker: 4})
	storeSome(t, e)
	before := hs.publishUntilSeen(e, 0)
	m := ckf.Member{WorkerID: 4}

	// A valid batch of blocks the engine does not hold: admitted, it would
	// show in the pool.
	tokens := make([]uint32, 16)
	payload, err := e.EncodeBatch(engine.Event{Type: "BlockStored", BlockHashes: []uint64{0xdead}, TokenIDs: tokens})
	require.NoError(t, err)
	for _, seq := range []int64{-5, EndOfReplay, math.MinInt64} {
		require.NoError(t, e.SendRaw([]byte{}, seqFrame(seq), payload))
	}
	require.Eventually(t, func() bool {
		return hs.src.Status().RejectedByReason[string(ReasonSequence)] == 3
	}, 10*time.Second, time.Millisecond)
	st := hs.src.Status()
	assert.Zero(t, st.Gaps)
	assert.Zero(t, st.Restarts)
	r, _ := rankOf(st, 0)
	assert.Equal(t, before, r)
	// The stream goes on where it was.
	storeSome(t, e)
	r = hs.publishUntilSeen(e, 0)
	assert.Equal(t, RankLive, r.State)
	assert.Zero(t, hs.src.Status().Gaps)
	hs.stop()
	requireExact(t, hs.pool, m, e.Truth())
}

// An engine at the end of the sequence space: 2^63-1 is applied; what a
// publisher sends next (2^63, read as -2^63) is rejected, not taken for a
// gap replayed from -2^63; an engine that then starts over at 0 is a restart
// (a new source epoch), and the rank is live and exact again.
func TestSource_SequenceSpaceEnd(t *testing.T) {
	pub, rep := endpoint(t, 1)
	e := startEngine(t, engine.Config{Endpoint: pub, Replay: rep})
	hs := newHarness(t, Config{Endpoint: pub, Replay: rep, Worker: 5})
	storeSome(t, e)
	hs.publishUntilSeen(e, 0)

	e.SkipTo(math.MaxInt64 - 1)
	_, err := e.Store(0, 2) // a gap the replay buffer cannot fill: degraded
	require.NoError(t, err)
	require.NoError(t, e.Heartbeat()) // seq 2^63-1
	require.Eventually(t, func() bool {
		r, _ := rankOf(hs.src.Status(), 0)
		return int64(r.Seq) == math.MaxInt64
	}, 10*time.Second, time.Millisecond)
	st := hs.src.Status()
	gaps, epoch := st.Gaps, st.Ranks[0].Epoch
	require.EqualValues(t, 1, gaps)

	require.NoError(t, e.Heartbeat()) // seq 2^63 on the wire
	require.Eventually(t, func() bool {
		return hs.src.Status().RejectedByReason[string(ReasonSequence)] == 1
	}, 10*time.Second, time.Millisecond)
	r, _ := rankOf(hs.src.Status(), 0)
	assert.EqualValues(t, math.MaxInt64, r.Seq, "the rank moved past 2^63-1")

	require.NoError(t, e.Restart())
	_, err = e.Store(0, 3)
	require.NoError(t, err)
	r = hs.publishUntilSeen(e, 0)
	st = hs.src.Status()
	assert.Equal(t, RankLive, r.State, "reason %q", r.Reason)
	assert.Equal(t, gaps, st.Gaps, "the wrap was taken for a gap")
	assert.EqualValues(t, 1, st.Restarts)
	assert.Greater(t, r.Epoch, epoch)
	hs.stop()
	requireExact(t, hs.pool, ckf.Member{WorkerID: 5}, e.Truth())
}

func FuzzParseMessage(f *testing.F) {
	f.Add([]byte("kv"), seqFrame(0), []byte{0x90}, uint8(3))
	f.Add([]byte("kv"), seqFrame(-1), []byte{0x90}, uint8(3))
	f.Add([]byte{}, seqFrame(math.MaxInt64), []byte{}, uint8(3))
	f.Fuzz(func(t *testing.T, a, b, c []byte, n uint8) {
		frames := [][]byte{a, b, c, a}[:int(n)%5]
		m, err := ParseMessage(frames)
		if err != nil {
			require.ErrorIs(t, err, ErrMalformed)
			return
		}
		require.GreaterOrEqual(t, m.Seq, int64(0))
		require.Equal(t, frames[2], m.Payload)
	})
}
