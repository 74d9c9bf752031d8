package wire_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire"
	"github.com/vmihailenco/msgpack/v5"
)

func sampleEvents() []ckf.RouterEvent {
	return []ckf.RouterEvent{
		{WorkerID: 1, EventID: 2, Kind: ckf.EventStored, Blocks: []ckf.StoredBlock{{BlockHash: 10, TokensHash: math.MaxUint64}}},
		{WorkerID: math.MaxUint64, StorageTier: ckf.TierHostPinned, EventID: 3, DPRank: 7, Kind: ckf.EventStored,
			HasParent: true, ParentHash: 10, HasStartPosition: true, StartPosition: 4,
			Blocks: []ckf.StoredBlock{{BlockHash: 11, TokensHash: 12}, {BlockHash: 13, TokensHash: 14}}},
		{WorkerID: 1, StorageTier: ckf.TierDisk, EventID: 4, Kind: ckf.EventRemoved, BlockHashes: []uint64{10, 1 << 63}},
		{WorkerID: 1, StorageTier: ckf.TierExternal, EventID: 5, DPRank: math.MaxUint32, Kind: ckf.EventCleared},
		{WorkerID: 2, EventID: 6, Kind: ckf.EventStored, Blocks: []ckf.StoredBlock{}},
	}
}

// normalize makes an empty slice and nil compare equal.
func normalize(ev ckf.RouterEvent) ckf.RouterEvent {
	if len(ev.Blocks) == 0 {
		ev.Blocks = nil
	}
	if len(ev.BlockHashes) == 0 {
		ev.BlockHashes = nil
	}
	return ev
}

func TestRouterEvent_RoundTrip(t *testing.T) {
	for i, ev := range sampleEvents() {
		j, err := wire.AppendRouterEventJSON(nil, &ev)
		require.NoError(t, err)
		got, err := wire.DecodeRouterEventJSON(j)
		require.NoError(t, err, "event %d JSON %s", i, j)
		require.Equal(t, normalize(ev), normalize(got), "event %d JSON %s", i, j)
		m, err := wire.AppendRouterEventMsgpack(nil, &ev)
		require.NoError(t, err)
		got, err = wire.DecodeRouterEventMsgpack(m)
		require.NoError(t, err, "event %d msgpack", i)
		require.Equal(t, normalize(ev), normalize(got), "event %d msgpack", i)
	}
}

func TestRouterEvents_BatchRoundTrip(t *testing.T) {
	evs := sampleEvents()
	j, err := wire.AppendRouterEventsJSON(nil, evs)
	require.NoError(t, err)
	m, err := wire.AppendRouterEventsMsgpack(nil, evs)
	require.NoError(t, err)
	prefix := []ckf.RouterEvent{{WorkerID: 99, Kind: ckf.EventCleared}}
	for name, decode := range map[string]func() ([]ckf.RouterEvent, error){
		"json":    func() ([]ckf.RouterEvent, error) { return wire.DecodeRouterEventsJSON(j, prefix) },
		"msgpack": func() ([]ckf.RouterEvent, error) { return wire.DecodeRouterEventsMsgpack(m, prefix) },
	} {
		got, err := decode()
		require.NoError(t, err, "%s", name)
		require.Len(t, got, len(evs)+1, "%s: prefix + events", name)
		require.Equal(t, uint64(99), got[0].WorkerID, "%s: prefix kept", name)
		for i := range evs {
			require.Equal(t, normalize(evs[i]), normalize(got[i+1]), "%s event %d", name, i)
		}
	}
}

// Dynamo's serde JSON as older and newer senders write it.
func TestDecodeRouterEventJSON_DynamoShapes(t *testing.T) {
	tests := []struct {
		name, in string
		want     ckf.RouterEvent
	}{
		{"minimal stored, no tier, no dp_rank, no start_position",
			`{"worker_id":7,"event":{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":18446744073709551615,"tokens_hash":5}]}}}}`,
			ckf.RouterEvent{WorkerID: 7, EventID: 1, Kind: ckf.EventStored, Blocks: []ckf.StoredBlock{{BlockHash: math.MaxUint64, TokensHash: 5}}}},
		{"parent absent entirely",
			`{"worker_id":7,"event":{"event_id":1,"data":{"stored":{"blocks":[]}}}}`,
			ckf.RouterEvent{WorkerID: 7, EventID: 1, Kind: ckf.EventStored}},
		{"unknown fields ignored (mm_extra_info, lora_id)",
			`{"worker_id":7,"storage_tier":"device","event":{"event_id":1,"dp_rank":2,"data":{"stored":{"parent_hash":9,"start_position":3,"lora_id":null,"blocks":[{"block_hash":1,"tokens_hash":2,"mm_extra_info":{"x":[1,2]}}]}}},"extra":true}`,
			ckf.RouterEvent{WorkerID: 7, EventID: 1, DPRank: 2, Kind: ckf.EventStored, HasParent: true, ParentHash: 9, HasStartPosition: true, StartPosition: 3, Blocks: []ckf.StoredBlock{{BlockHash: 1, TokensHash: 2}}}},
		{"removed", `{"worker_id":1,"event":{"event_id":2,"data":{"removed":{"block_hashes":[3,4]}}}}`,
			ckf.RouterEvent{WorkerID: 1, EventID: 2, Kind: ckf.EventRemoved, BlockHashes: []uint64{3, 4}}},
		{"cleared as string", `{"worker_id":1,"storage_tier":"disk","event":{"event_id":2,"data":"cleared"}}`,
			ckf.RouterEvent{WorkerID: 1, StorageTier: ckf.TierDisk, EventID: 2, Kind: ckf.EventCleared}},
		{"cleared as map", `{"worker_id":1,"event":{"event_id":2,"data":{"cleared":null}}}`,
			ckf.RouterEvent{WorkerID: 1, EventID: 2, Kind: ckf.EventCleared}},
		{"whitespace", " \n{ \"worker_id\" : 1 , \"event\" : { \"event_id\" : 2 , \"data\" : \"cleared\" } }\n ",
			ckf.RouterEvent{WorkerID: 1, EventID: 2, Kind: ckf.EventCleared}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := wire.DecodeRouterEventJSON([]byte(tt.in))
			require.NoError(t, err)
			require.Equal(t, normalize(tt.want), normalize(got))
		})
	}
}

func TestDecodeRouterEventJSON_Errors(t *testing.T) {
	tests := []struct {
		name, in string
		want     error
	}{
		{"empty", ``, wire.ErrTruncated},
		{"cut", `{"worker_id":1,"event":{"event_id":2`, wire.ErrTruncated},
		{"trailing", `{"worker_id":1,"event":{"event_id":2,"data":"cleared"}} x`, wire.ErrTrailingBytes},
		{"two values", `{"worker_id":1,"event":{"event_id":2,"data":"cleared"}}{}`, wire.ErrTrailingBytes},
		{"missing worker_id", `{"event":{"event_id":2,"data":"cleared"}}`, wire.ErrMalformed},
		{"missing event", `{"worker_id":1}`, wire.ErrMalformed},
		{"missing event_id", `{"worker_id":1,"event":{"data":"cleared"}}`, wire.ErrMalformed},
		{"missing data", `{"worker_id":1,"event":{"event_id":2}}`, wire.ErrMalformed},
		{"null data", `{"worker_id":1,"event":{"event_id":2,"data":null}}`, wire.ErrMalformed},
		{"negative worker", `{"worker_id":-1,"event":{"event_id":2,"data":"cleared"}}`, wire.ErrMalformed},
		{"worker above u64", `{"worker_id":18446744073709551616,"event":{"event_id":2,"data":"cleared"}}`, wire.ErrMalformed},
		{"float id", `{"worker_id":1.5,"event":{"event_id":2,"data":"cleared"}}`, wire.ErrMalformed},
		{"string id", `{"worker_id":"1","event":{"event_id":2,"data":"cleared"}}`, wire.ErrMalformed},
		{"dp_rank above u32", `{"worker_id":1,"event":{"event_id":2,"dp_rank":4294967296,"data":"cleared"}}`, wire.ErrMalformed},
		{"unknown tier", `{"worker_id":1,"storage_tier":"gpu","event":{"event_id":2,"data":"cleared"}}`, wire.ErrMalformed},
		{"unknown variant", `{"worker_id":1,"event":{"event_id":2,"data":{"moved":{}}}}`, wire.ErrMalformed},
		{"unit stored", `{"worker_id":1,"event":{"event_id":2,"data":"stored"}}`, wire.ErrMalformed},
		{"two variants", `{"worker_id":1,"event":{"event_id":2,"data":{"stored":{"blocks":[]},"removed":{"block_hashes":[]}}}}`, wire.ErrMalformed},
		{"stored without blocks", `{"worker_id":1,"event":{"event_id":2,"data":{"stored":{"parent_hash":1}}}}`, wire.ErrMalformed},
		{"stored null", `{"worker_id":1,"event":{"event_id":2,"data":{"stored":null}}}`, wire.ErrMalformed},
		{"block without tokens_hash", `{"worker_id":1,"event":{"event_id":2,"data":{"stored":{"blocks":[{"block_hash":1}]}}}}`, wire.ErrMalformed},
		{"null hash in removed", `{"worker_id":1,"event":{"event_id":2,"data":{"removed":{"block_hashes":[1,null]}}}}`, wire.ErrMalformed},
		{"cleared with data", `{"worker_id":1,"event":{"event_id":2,"data":{"cleared":{}}}}`, wire.ErrMalformed},
		{"not an object", `[1]`, wire.ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := wire.DecodeRouterEventJSON([]byte(tt.in))
			require.ErrorIs(t, err, tt.want)
			var de *wire.DecodeError
			require.ErrorAs(t, err, &de)
		})
	}
}

// Events written by an independent msgpack encoder (vmihailenco's generic
// map encoding, as rmp_serde::to_vec_named writes them) decode.
func TestDecodeRouterEventMsgpack_ForeignEncoder(t *testing.T) {
	type m = map[string]any
	tests := []struct {
		name string
		in   any
		want ckf.RouterEvent
	}{
		{"stored, int64 widths, unknown fields",
			m{"worker_id": int64(7), "event": m{"event_id": uint16(1), "data": m{"stored": m{"parent_hash": nil, "mm": []any{1, "x", 2.5, m{"a": true}}, "blocks": []any{m{"block_hash": uint64(math.MaxUint64), "tokens_hash": int8(5), "mm_extra_info": nil}}}}}, "future": []byte{1}},
			ckf.RouterEvent{WorkerID: 7, EventID: 1, Kind: ckf.EventStored, Blocks: []ckf.StoredBlock{{BlockHash: math.MaxUint64, TokensHash: 5}}}},
		{"removed with tier", m{"worker_id": 1, "storage_tier": "host_pinned", "event": m{"event_id": 2, "dp_rank": 3, "data": m{"removed": m{"block_hashes": []uint64{3, 4}}}}},
			ckf.RouterEvent{WorkerID: 1, StorageTier: ckf.TierHostPinned, EventID: 2, DPRank: 3, Kind: ckf.EventRemoved, BlockHashes: []uint64{3, 4}}},
		{"cleared string", m{"worker_id": 1, "event": m{"event_id": 2, "data": "cleared"}},
			ckf.RouterEvent{WorkerID: 1, EventID: 2, Kind: ckf.EventCleared}},
		{"cleared map", m{"worker_id": 1, "event": m{"event_id": 2, "data": m{"cleared": nil}}},
			ckf.RouterEvent{WorkerID: 1, EventID: 2, Kind: ckf.EventCleared}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := msgpack.Marshal(tt.in)
			require.NoError(t, err)
			got, err := wire.DecodeRouterEventMsgpack(b)
			require.NoError(t, err)
			require.Equal(t, normalize(tt.want), normalize(got))
		})
	}
}

func TestDecodeRouterEventMsgpack_Errors(t *testing.T) {
	type m = map[string]any
	cleared := m{"event_id": 2, "data": "cleared"}
	tests := []struct {
		name string
		in   any
		want error
	}{
		{"missing worker_id", m{"event": cleared}, wire.ErrMalformed},
		{"missing event", m{"worker_id": 1}, wire.ErrMalformed},
		{"missing event_id", m{"worker_id": 1, "event": m{"data": "cleared"}}, wire.ErrMalformed},
		{"negative worker", m{"worker_id": -1, "event": cleared}, wire.ErrMalformed},
		{"float worker", m{"worker_id": 1.0, "event": cleared}, wire.ErrMalformed},
		{"dp_rank above u32", m{"worker_id": 1, "event": m{"event_id": 2, "dp_rank": int64(1) << 32, "data": "cleared"}}, wire.ErrMalformed},
		{"start_position above u32", m{"worker_id": 1, "event": m{"event_id": 2, "data": m{"stored": m{"start_position": int64(1) << 32, "blocks": []any{}}}}}, wire.ErrMalformed},
		{"unknown tier", m{"worker_id": 1, "storage_tier": "gpu", "event": cleared}, wire.ErrMalformed},
		{"unknown variant", m{"worker_id": 1, "event": m{"event_id": 2, "data": m{"moved": m{}}}}, wire.ErrMalformed},
		{"unit removed", m{"worker_id": 1, "event": m{"event_id": 2, "data": "removed"}}, wire.ErrMalformed},
		{"block missing hash", m{"worker_id": 1, "event": m{"event_id": 2, "data": m{"stored": m{"blocks": []any{m{"tokens_hash": 1}}}}}}, wire.ErrMalformed},
		{"removed null hash", m{"worker_id": 1, "event": m{"event_id": 2, "data": m{"removed": m{"block_hashes": []any{1, nil}}}}}, wire.ErrMalformed},
		{"array form", []any{1, "device", cleared}, wire.ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := msgpack.Marshal(tt.in)
			require.NoError(t, err)
			_, err = wire.DecodeRouterEventMsgpack(b)
			require.ErrorIs(t, err, tt.want)
		})
	}
	// Byte-level cases a map encoder cannot produce.
	ok, _ := wire.AppendRouterEventMsgpack(nil, &sampleEvents()[3])
	raw := []struct {
		name string
		in   []byte
		want error
	}{
		{"truncated", ok[:len(ok)-1], wire.ErrTruncated},
		{"trailing", append(append([]byte(nil), ok...), 0xc0), wire.ErrTrailingBytes},
		{"empty", nil, wire.ErrTruncated},
		{"duplicate worker_id", append([]byte{0x83, 0xa9}, append([]byte("worker_id\x01\xa9worker_id\x02"), ok[1:]...)...), wire.ErrMalformed},
		{"map32 huge count", []byte{0xdf, 0xff, 0xff, 0xff, 0xff}, wire.ErrTruncated},
		{"deep nesting", append(append([]byte{0x81, 0xa1, 'x'}, repeat(0x91, 100)...), 0xc0), wire.ErrMalformed},
	}
	for _, tt := range raw {
		t.Run(tt.name, func(t *testing.T) {
			_, err := wire.DecodeRouterEventMsgpack(tt.in)
			require.ErrorIs(t, err, tt.want)
		})
	}
}

func repeat(b byte, n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = b
	}
	return out
}

func TestAppendRouterEvent_Errors(t *testing.T) {
	for _, ev := range []ckf.RouterEvent{{Kind: 0}, {Kind: 9}, {Kind: ckf.EventCleared, StorageTier: 9}} {
		_, err := wire.AppendRouterEventJSON(nil, &ev)
		assert.ErrorIs(t, err, wire.ErrInvalidEvent, "JSON %+v", ev)
		_, err = wire.AppendRouterEventMsgpack(nil, &ev)
		assert.ErrorIs(t, err, wire.ErrInvalidEvent, "msgpack %+v", ev)
	}
}

func TestDecodeRouterEvents_ErrorLeavesDst(t *testing.T) {
	dst := []ckf.RouterEvent{{WorkerID: 99}}
	got, err := wire.DecodeRouterEventsJSON([]byte(`[{"worker_id":1,"event":{"event_id":2,"data":"cleared"}},{"worker_id":1}]`), dst)
	require.ErrorIs(t, err, wire.ErrMalformed, "JSON")
	require.Equal(t, []ckf.RouterEvent{{WorkerID: 99}}, got, "JSON: dst unchanged")
	b, _ := msgpack.Marshal([]any{map[string]any{"worker_id": 1}})
	got, err = wire.DecodeRouterEventsMsgpack(b, dst)
	require.ErrorIs(t, err, wire.ErrMalformed, "msgpack")
	require.Equal(t, []ckf.RouterEvent{{WorkerID: 99}}, got, "msgpack: dst unchanged")
	_, err = wire.DecodeRouterEventsJSON([]byte(`null`), nil)
	require.ErrorIs(t, err, wire.ErrMalformed, "JSON null batch")
}
