package tail

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire"
)

// printFrames prints one JSON object per frame, words and images in hex, and
// stops after the close frame.
func TestTailFrames_JSONLinesWithHexWords(t *testing.T) {
	id := ckf.ProducerIdentity{Pool: ckf.PoolID{DCID: 3}, ProducerIncarnation: 9, Format: ckf.NewFormat(ckf.DefaultSeed, 4)}
	lease := ckf.LaneLease{ConsumerInstance: 5, PhysicalLane: 2, AssignmentEpoch: 11}
	var buf bytes.Buffer
	w := wire.NewWriter(&buf, 0)
	snap := ckf.Snapshot{Identity: id, Lease: lease, Sequence: 7, Words: []uint64{0, 0xdeadbeef, 1 << 63, 42}}
	require.NoError(t, w.WriteSnapshot(&snap))
	frames := []wire.Frame{
		{Kind: wire.KindDelta, Delta: ckf.Delta{Identity: id, Lease: lease, BaseSequence: 7, Sequence: 8, Images: []ckf.BucketImage{{Bucket: 1, Word: 0xabc}}}},
		{Kind: wire.KindHeartbeat, Heartbeat: wire.Heartbeat{Identity: id, Lease: lease, LastSequence: 8, UnixMicros: 1}},
		{Kind: wire.KindDrainMarker, Drain: ckf.DrainMarker{Lease: lease, ExpectedSequence: 8}},
		{Kind: wire.KindClose, Close: wire.Close{Reason: wire.CloseShuttingDown, Message: "bye"}},
		{Kind: wire.KindHeartbeat, Heartbeat: wire.Heartbeat{Identity: id, Lease: lease, LastSequence: 8}}, // after close: not printed
	}
	for i := range frames {
		require.NoError(t, w.WriteFrame(&frames[i]))
	}
	var out bytes.Buffer
	require.NoError(t, printFrames(&buf, &out, 0), "printFrames")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	wantKinds := []string{"snapshot_chunk", "delta", "heartbeat", "drain_marker", "close"}
	require.Len(t, lines, len(wantKinds), "got %d lines, want %d:\n%s", len(lines), len(wantKinds), out.String())
	var got []map[string]any
	for i, l := range lines {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), "line %d %q is not JSON", i, l)
		assert.False(t, m["kind"] != wantKinds[i], "line %d kind %v, want %s", i, m["kind"], wantKinds[i])
		got = append(got, m)
	}
	ws := fmt.Sprint(got[0]["words"])
	assert.Equal(t, "[0000000000000000 00000000deadbeef 8000000000000000 000000000000002a]", ws, "snapshot words %s, want 16-digit hex", ws)
	assert.False(t, got[0]["sequence"] != "7" || fmt.Sprint(got[0]["lease"]) != "map[consumer:5 epoch:11 lane:2]", "snapshot line %v, want sequence 7 under lease 5/2/11", got[0])
	im := fmt.Sprint(got[1]["images"])
	assert.Equal(t, "[map[bucket:1 word:0000000000000abc]]", im, "delta images %s, want bucket 1 word in hex", im)
	assert.False(t, got[3]["expected_sequence"] != "8" || got[4]["reason"] != "shutting_down", "drain %v / close %v, want expected 8 and reason shutting_down", got[3], got[4])

	// --frames limits the output.
	out.Reset()
	buf.Reset()
	_ = w.WriteSnapshot(&snap)
	_ = w.WriteFrame(&frames[0])
	err := printFrames(&buf, &out, 1)
	assert.False(t, err != nil || strings.Count(out.String(), "\n") != 1, "printFrames(limit 1) = %v, %q; want one line", err, out.String())
	// A corrupt stream is an error, not a panic.
	assert.Error(t, printFrames(strings.NewReader("\x00\x00\x00\x05garbage"), io.Discard, 0), "printFrames(garbage) = nil, want an error")
}
