package zmq

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

func mp(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	require.NoError(t, err)
	return b
}

func digest(h uint64) []byte {
	d := make([]byte, 32)
	d[0] = 0xAA
	binary.BigEndian.PutUint64(d[24:], h)
	return d
}

func TestDecodeBatch_AcceptedForms(t *testing.T) {
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	stored := Event{Type: BlockStored, BlockHashes: []uint64{10, math.MaxUint64}, HasParent: true, ParentHash: 9,
		TokenIDs: toks, BlockSize: 4, LoRAName: "ad", Medium: "GPU"}
	cases := []struct {
		name  string
		batch []any
		want  Batch
	}{
		{"positional vLLM, int hashes, dp rank", []any{1.5, []any{
			[]any{"BlockStored", []any{uint64(10), int64(-1)}, uint64(9), toks, 4, nil, "GPU", "ad", nil, 0, "full_attention", nil},
		}, 3}, Batch{Timestamp: 1.5, Events: []Event{stored}, HasDPRank: true, DPRank: 3}},
		{"positional with byte hashes and a publisher id", []any{2, []any{
			[]any{"BlockStored", []any{digest(10), digest(math.MaxUint64)}, digest(9), toks, 4, 7, "GPU", "ad"},
		}, nil, []byte{1, 2}}, Batch{Timestamp: 2, Events: []Event{stored}, PublisherID: []byte{1, 2}}},
		{"older SGLang: ends at lora_id, metadata map at lora_name's slot elsewhere", []any{0.0, []any{
			[]any{"BlockStored", []any{10}, nil, toks[:4], 4, nil},
			[]any{"BlockStored", []any{11}, nil, toks[:4], 4, nil, "CPU_TIER1", map[string]any{"cache_salt": "x"}},
		}}, Batch{Events: []Event{
			{Type: BlockStored, BlockHashes: []uint64{10}, TokenIDs: toks[:4], BlockSize: 4},
			{Type: BlockStored, BlockHashes: []uint64{11}, TokenIDs: toks[:4], BlockSize: 4, Medium: "CPU_TIER1"},
		}}},
		{"named events with unknown fields", []any{1.0, []any{
			map[string]any{"type": "BlockStored", "block_hashes": []any{10, int64(-1)}, "parent_block_hash": 9,
				"token_ids": toks, "block_size": 4, "lora_name": "ad", "medium": "GPU", "locality": "LOCAL",
				"session_id": "s", "extra_keys": []any{[]any{"mm", 1}}, "ownership": map[string]any{"a": []any{1}}},
			map[string]any{"type": "BlockRemoved", "block_hashes": []any{digest(10)}, "medium": nil, "group_idx": 2},
			map[string]any{"type": "AllBlocksCleared"},
		}, 0, nil, "a fifth element"}, Batch{Timestamp: 1, HasDPRank: true, Events: []Event{
			{Type: BlockStored, BlockHashes: []uint64{10, math.MaxUint64}, HasParent: true, ParentHash: 9,
				TokenIDs: toks, BlockSize: 4, LoRAName: "ad", Medium: "GPU", Locality: "LOCAL"},
			{Type: BlockRemoved, BlockHashes: []uint64{10}},
			{Type: AllBlocksCleared},
		}}},
		{"positional removed and cleared, an unknown type", []any{1.0, []any{
			[]any{"BlockRemoved", []any{5, 6}, "CPU", 0, "x"},
			[]any{"AllBlocksCleared"},
			[]any{"BlockUpdated", 1, 2},
		}}, Batch{Timestamp: 1, Events: []Event{
			{Type: BlockRemoved, BlockHashes: []uint64{5, 6}, Medium: "CPU"},
			{Type: AllBlocksCleared},
			{Type: Unknown},
		}}},
		{"heartbeat", []any{1.0, []any{}, 0}, Batch{Timestamp: 1, HasDPRank: true, Events: []Event{}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := NewDecoder(Limits{}).DecodeBatch(mp(t, tc.batch))
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestDecodeBatch_Rejections(t *testing.T) {
	toks := []uint32{1, 2, 3, 4}
	cases := []struct {
		name   string
		batch  any
		reason Reason
	}{
		{"not an array", map[string]any{"ts": 1}, ReasonBatch},
		{"one element", []any{1.0}, ReasonBatch},
		{"ts a string", []any{"x", []any{}}, ReasonBatch},
		{"events a map", []any{1.0, map[string]any{}}, ReasonBatch},
		{"dp rank negative", []any{1.0, []any{}, -1}, ReasonBatch},
		{"dp rank a string", []any{1.0, []any{}, "0"}, ReasonBatch},
		{"publisher id an int", []any{1.0, []any{}, 0, 5}, ReasonBatch},
		{"event a string", []any{1.0, []any{"BlockStored"}}, ReasonEvent},
		{"empty event array", []any{1.0, []any{[]any{}}}, ReasonEvent},
		{"tag an int", []any{1.0, []any{[]any{1, 2}}}, ReasonEvent},
		{"stored too short", []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, toks}}}, ReasonRequired},
		{"removed without hashes", []any{1.0, []any{[]any{"BlockRemoved"}}}, ReasonRequired},
		{"map without type", []any{1.0, []any{map[string]any{"block_hashes": []any{1}}}}, ReasonRequired},
		{"map stored without token_ids", []any{1.0, []any{map[string]any{"type": "BlockStored", "block_hashes": []any{1}, "block_size": 4}}}, ReasonRequired},
		{"hash a float", []any{1.0, []any{[]any{"BlockRemoved", []any{1.5}}}}, ReasonField},
		{"hash nil", []any{1.0, []any{[]any{"BlockRemoved", []any{nil}}}}, ReasonField},
		{"hash empty bytes", []any{1.0, []any{[]any{"BlockRemoved", []any{[]byte{}}}}}, ReasonField},
		{"token negative", []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{-1, 2, 3, 4}, 4}}}, ReasonField},
		{"token too big", []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{uint64(1) << 32, 2, 3, 4}, 4}}}, ReasonField},
		{"token a float", []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{1.0, 2, 3, 4}, 4}}}, ReasonField},
		{"block size zero", []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, toks, 0}}}, ReasonField},
		{"medium an int", []any{1.0, []any{[]any{"BlockRemoved", []any{1}, 3}}}, ReasonField},
		{"lora_name an int", []any{1.0, []any{map[string]any{"type": "BlockStored", "block_hashes": []any{1}, "token_ids": toks, "block_size": 4, "lora_name": 1}}}, ReasonField},
		{"type an int", []any{1.0, []any{map[string]any{"type": 1}}}, ReasonField},
		{"map key an int", []any{1.0, []any{map[any]any{1: 2}}}, ReasonEvent},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewDecoder(Limits{}).DecodeBatch(mp(t, tc.batch))
			require.ErrorIs(t, err, ErrMalformed)
			var de *DecodeError
			require.ErrorAs(t, err, &de)
			assert.Equal(t, tc.reason, de.Reason, err.Error())
		})
	}
	t.Run("limits", func(t *testing.T) {
		d := NewDecoder(Limits{MaxEvents: 1, MaxBlocks: 2, MaxTokens: 4})
		for _, b := range []any{
			[]any{1.0, []any{[]any{"AllBlocksCleared"}, []any{"AllBlocksCleared"}}},
			[]any{1.0, []any{[]any{"BlockRemoved", []any{1, 2, 3}}}},
			[]any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{1, 2, 3, 4, 5}, 4}}},
		} {
			_, err := d.DecodeBatch(mp(t, b))
			var de *DecodeError
			require.ErrorAs(t, err, &de)
			assert.Equal(t, ReasonLimit, de.Reason)
		}
	})
	t.Run("trailing bytes and truncation", func(t *testing.T) {
		p := mp(t, []any{1.0, []any{[]any{"BlockRemoved", []any{1, 2}}}})
		_, err := NewDecoder(Limits{}).DecodeBatch(append(p, 0xc0))
		require.ErrorIs(t, err, ErrMalformed)
		for i := range len(p) {
			_, err := NewDecoder(Limits{}).DecodeBatch(p[:i])
			require.ErrorIs(t, err, ErrMalformed, "truncated at %d", i)
		}
	})
	t.Run("deep nesting in an ignored field", func(t *testing.T) {
		var v any = 1
		for range 100 {
			v = []any{v}
		}
		_, err := NewDecoder(Limits{}).DecodeBatch(mp(t, []any{1.0, []any{[]any{"BlockRemoved", []any{1}, nil, v}}}))
		var de *DecodeError
		require.ErrorAs(t, err, &de)
		assert.Equal(t, ReasonNesting, de.Reason)
	})
}

func TestParseMessage(t *testing.T) {
	m, err := ParseMessage([][]byte{[]byte("kv"), {0, 0, 0, 0, 0, 0, 1, 2}, {0x90}})
	require.NoError(t, err)
	assert.Equal(t, Message{Topic: []byte("kv"), Seq: 258, Payload: []byte{0x90}}, m)
	_, err = ParseMessage([][]byte{{}, {1}})
	require.ErrorIs(t, err, ErrMalformed)
	_, err = ParseMessage([][]byte{{}, {1, 2, 3}, {}})
	require.ErrorIs(t, err, ErrMalformed)
}

func TestParseReplayReply_BothLayouts(t *testing.T) {
	seq := func(v int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(v)) }
	cases := []struct {
		frames [][]byte
		want   Message
	}{
		{[][]byte{seq(5), {0x90}}, Message{Seq: 5, Payload: []byte{0x90}}},
		{[][]byte{{}, seq(5), {0x90}}, Message{Topic: []byte{}, Seq: 5, Payload: []byte{0x90}}},
		{[][]byte{[]byte("kv"), seq(5), {0x90}}, Message{Topic: []byte("kv"), Seq: 5, Payload: []byte{0x90}}},
		{[][]byte{{}, []byte("kv"), seq(5), {0x90}}, Message{Topic: []byte("kv"), Seq: 5, Payload: []byte{0x90}}},
		{[][]byte{{}, {}, seq(-1), {}}, Message{Topic: []byte{}, Seq: -1, Payload: []byte{}}},
		{[][]byte{seq(-1), {}}, Message{Seq: -1, Payload: []byte{}}},
	}
	for _, tc := range cases {
		got, err := ParseReplayReply(tc.frames)
		require.NoError(t, err)
		assert.Equal(t, tc.want, got)
	}
	for _, bad := range [][][]byte{{seq(1)}, {{1}, {}}, {{1}, {}, seq(1), {}}, {{}, {}, {}, seq(1), {}}} {
		_, err := ParseReplayReply(bad)
		require.ErrorIs(t, err, ErrMalformed)
	}
}

func FuzzDecodeBatch(f *testing.F) {
	toks := []uint32{1, 2, 3, 4}
	for _, b := range []any{
		[]any{1.5, []any{[]any{"BlockStored", []any{uint64(10), int64(-1)}, uint64(9), toks, 4, nil, "GPU", "ad", nil, 0}}, 3},
		[]any{1.0, []any{map[string]any{"type": "BlockStored", "block_hashes": []any{digest(1)}, "token_ids": toks, "block_size": 4}}, nil, []byte{1}},
		[]any{1.0, []any{[]any{"BlockRemoved", []any{5}, "CPU"}, []any{"AllBlocksCleared"}}},
		[]any{1.0, []any{}},
	} {
		f.Add(mp(f, b))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		d := NewDecoder(Limits{MaxEvents: 64, MaxBlocks: 64, MaxTokens: 1024})
		b, err := d.DecodeBatch(payload)
		if err != nil {
			require.ErrorIs(t, err, ErrMalformed)
			return
		}
		for _, ev := range b.Events {
			require.LessOrEqual(t, len(ev.BlockHashes), 64)
			require.LessOrEqual(t, len(ev.TokenIDs), 1024)
			// Every accepted event converts without panicking.
			_, _, _, _ = Converter{Worker: 1, BlockSize: 4}.Convert(&ev, b.DPRank, 1)
		}
		// Decoding is deterministic and the decoder reusable.
		again, err := d.DecodeBatch(payload)
		require.NoError(t, err)
		require.Equal(t, b, again)
	})
}

func FuzzParseReplayReply(f *testing.F) {
	f.Add([]byte{}, []byte{0, 0, 0, 0, 0, 0, 0, 1}, []byte{0x90}, uint8(3))
	f.Fuzz(func(t *testing.T, a, b, c []byte, n uint8) {
		frames := [][]byte{a, b, c, a, b}[:int(n)%6]
		m, err := ParseReplayReply(frames)
		if err != nil {
			require.ErrorIs(t, err, ErrMalformed)
			return
		}
		require.Equal(t, frames[len(frames)-1], m.Payload)
	})
}
