package wire_test

import (
	"bytes"
	"encoding/binary"
	"runtime"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire"
)

type batchDecoder func(data []byte, lim wire.BatchLimits) ([]ckf.RouterEvent, error)

var batchCodecs = map[string]struct {
	encode func([]ckf.RouterEvent) ([]byte, error)
	decode batchDecoder
}{
	"json": {func(evs []ckf.RouterEvent) ([]byte, error) { return wire.AppendRouterEventsJSON(nil, evs) },
		func(b []byte, lim wire.BatchLimits) ([]ckf.RouterEvent, error) {
			return wire.DecodeRouterEventsJSONLimited(b, nil, lim)
		}},
	"msgpack": {func(evs []ckf.RouterEvent) ([]byte, error) { return wire.AppendRouterEventsMsgpack(nil, evs) },
		func(b []byte, lim wire.BatchLimits) ([]ckf.RouterEvent, error) {
			return wire.DecodeRouterEventsMsgpackLimited(b, nil, lim)
		}},
}

func blocksEvent(n int) ckf.RouterEvent {
	ev := ckf.RouterEvent{WorkerID: 1, EventID: 1, Kind: ckf.EventStored}
	for i := range n {
		ev.Blocks = append(ev.Blocks, ckf.StoredBlock{BlockHash: uint64(i + 1), TokensHash: uint64(i + 7)})
	}
	return ev
}

func hashesEvent(n int) ckf.RouterEvent {
	ev := ckf.RouterEvent{WorkerID: 1, EventID: 2, Kind: ckf.EventRemoved}
	for i := range n {
		ev.BlockHashes = append(ev.BlockHashes, uint64(i+1))
	}
	return ev
}

func TestDecodeRouterEventsLimited_EnforcesLimits(t *testing.T) {
	cleared := ckf.RouterEvent{WorkerID: 3, EventID: 9, Kind: ckf.EventCleared}
	lim := wire.BatchLimits{MaxEvents: 3, MaxBlocksPerEvent: 4}
	tests := []struct {
		name string
		evs  []ckf.RouterEvent
		ok   bool
	}{
		{"at both limits", []ckf.RouterEvent{blocksEvent(4), hashesEvent(4), cleared}, true},
		{"one event too many", []ckf.RouterEvent{cleared, cleared, cleared, cleared}, false},
		{"one block too many", []ckf.RouterEvent{blocksEvent(5)}, false},
		{"one hash too many", []ckf.RouterEvent{cleared, hashesEvent(5)}, false},
		{"empty", nil, true},
	}
	for name, c := range batchCodecs {
		for _, tc := range tests {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				b, err := c.encode(tc.evs)
				require.NoError(t, err)
				got, err := c.decode(b, lim)
				if tc.ok {
					require.NoError(t, err)
					assert.Len(t, got, len(tc.evs))
					return
				}
				require.ErrorIs(t, err, wire.ErrLimitExceeded)
				var de *wire.DecodeError
				require.ErrorAs(t, err, &de)
				// Unlimited, the same batch decodes: only the limit refused it.
				_, err = c.decode(b, wire.BatchLimits{})
				require.NoError(t, err)
			})
		}
	}
}

func TestDecodeRouterEventsJSONLimited_NamesTheEvent(t *testing.T) {
	b, err := wire.AppendRouterEventsJSON(nil, []ckf.RouterEvent{blocksEvent(1), blocksEvent(9)})
	require.NoError(t, err)
	_, err = wire.DecodeRouterEventsJSONLimited(b, nil, wire.BatchLimits{MaxBlocksPerEvent: 8})
	var de *wire.DecodeError
	require.ErrorAs(t, err, &de)
	assert.ErrorIs(t, err, wire.ErrLimitExceeded)
	assert.Equal(t, "[1]", de.Field)
	// A malformed event deep in a batch is named too, offsets on the batch.
	_, err = wire.DecodeRouterEventsJSONLimited([]byte(`[{"worker_id":1,"event":{"event_id":1,"data":"cleared"}}, {"worker_id":"x"}]`), nil, wire.BatchLimits{})
	require.ErrorAs(t, err, &de)
	assert.ErrorIs(t, err, wire.ErrMalformed)
	assert.Contains(t, de.Field, "[1]")
}

// allocated returns the bytes f allocates.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// hostileBatches are ~16 MiB bodies (the relay's default request limit) that
// the old whole-then-check decoders turned into hundreds of MiB.
func hostileBatches(t *testing.T) map[string][]byte {
	const size = 16 << 20
	out := map[string][]byte{}
	var b bytes.Buffer
	b.WriteByte('[')
	for b.Len() < size {
		b.WriteString("{},")
	}
	b.WriteString("{}]")
	out["json/millions of empty objects"] = bytes.Clone(b.Bytes())

	b.Reset()
	ev := `{"worker_id":1,"event":{"event_id":1,"data":"cleared"}}`
	b.WriteByte('[')
	for b.Len() < size {
		b.WriteString(ev + ",")
	}
	b.WriteString(ev + "]")
	out["json/too many valid events"] = bytes.Clone(b.Bytes())

	b.Reset()
	b.WriteString(`[{"worker_id":1,"event":{"event_id":1,"data":{"removed":{"block_hashes":[`)
	for i := 0; b.Len() < size; i++ {
		b.WriteString(strconv.Itoa(i&7) + ",")
	}
	b.WriteString("0]}}}}]")
	out["json/millions of hashes"] = bytes.Clone(b.Bytes())

	// msgpack: one removed event whose array32 announces 16 M positive
	// fixints, all present.
	const hashes = 16 << 20
	one, err := wire.AppendRouterEventsMsgpack(nil, []ckf.RouterEvent{hashesEvent(1)})
	require.NoError(t, err)
	require.Equal(t, []byte{0x91, 0x01}, one[len(one)-2:], "a removed event ends with its hashes array")
	m := append(bytes.Clone(one[:len(one)-2]), 0xdd)
	m = binary.BigEndian.AppendUint32(m, hashes)
	m = append(m, bytes.Repeat([]byte{0x01}, hashes)...)
	out["msgpack/millions of hashes"] = m
	return out
}

func TestDecodeRouterEventsLimited_HostileInputAllocatesLittle(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 16 MiB inputs")
	}
	lim := wire.BatchLimits{MaxEvents: 64, MaxBlocksPerEvent: 64}
	// The largest batch lim admits, encoded: what a request may justify.
	full := make([]ckf.RouterEvent, lim.MaxEvents)
	for i := range full {
		full[i] = blocksEvent(lim.MaxBlocksPerEvent)
	}
	justified, err := wire.AppendRouterEventsJSON(nil, full)
	require.NoError(t, err)
	for name, body := range hostileBatches(t) {
		t.Run(name, func(t *testing.T) {
			decode := batchCodecs["json"].decode
			if bytes.HasPrefix([]byte(name), []byte("msgpack")) {
				decode = batchCodecs["msgpack"].decode
			}
			var derr error
			n := allocated(func() { _, derr = decode(body, lim) })
			require.Error(t, derr)
			assert.LessOrEqual(t, n, uint64(4*len(justified)),
				"decoding a %d-byte hostile batch allocated %d bytes; the limits justify %d", len(body), n, len(justified))
		})
	}
}
