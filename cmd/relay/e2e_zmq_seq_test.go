package main

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/sim/engine"
	"github.com/ckfrelay/ckfrelay/internal/source"
)

// The relay binary rejects a negative ZMQ sequence (counted under reason
// "sequence", nothing admitted), and an engine that reaches 2^63-1 and goes
// on is neither taken for a gap nor replayed from -2^63: its restart at 0
// is tracked, live and exact.
func TestE2E_ZMQSequenceSpace(t *testing.T) {
	e, src := zmqEngineRelay(t)
	rl := startRelay(t, "--listen", "127.0.0.1:0", "--pool", "dc-a:dc=1,expected=65536", "--source", src)
	_, err := e.Store(0, 2)
	require.NoError(t, err)
	waitSource(t, e, rl.base, "2 blocks", func(st source.Status, blocks int) bool { return blocks == 2 })

	payload, err := e.EncodeBatch(engine.Event{Type: "BlockStored", BlockHashes: []uint64{0xbad}, TokenIDs: make([]uint32, 16)})
	require.NoError(t, err)
	require.NoError(t, e.SendRaw([]byte{}, binary.BigEndian.AppendUint64(nil, uint64(math.MaxUint64-4)), payload)) // -5
	waitSource(t, e, rl.base, "the negative sequence rejected, nothing admitted", func(st source.Status, blocks int) bool {
		return st.RejectedByReason["sequence"] >= 1 && blocks == 2 && st.Gaps == 0
	})

	e.SkipTo(math.MaxInt64 - 1)
	_, err = e.Store(0, 1) // seq 2^63-2: a gap no replay can fill (degraded)
	require.NoError(t, err)
	require.NoError(t, e.Heartbeat()) // 2^63-1
	waitSource(t, e, rl.base, "2^63-1 applied", func(st source.Status, blocks int) bool {
		return len(st.Ranks) == 1 && int64(st.Ranks[0].Seq) == math.MaxInt64
	})
	before, _ := sourceOf(t, rl.base, "dc-a")
	require.NoError(t, e.Heartbeat()) // 2^63: read as -2^63, rejected
	require.NoError(t, e.Restart())
	_, err = e.Store(0, 3)
	require.NoError(t, err)
	waitSource(t, e, rl.base, "the restarted engine's 3 blocks, live, no new gap", func(st source.Status, blocks int) bool {
		return blocks == 3 && st.State == "live" && st.Gaps == before.Gaps && st.Restarts > before.Restarts &&
			len(st.Ranks) == 1 && st.Ranks[0].Epoch > before.Ranks[0].Epoch
	})
}
