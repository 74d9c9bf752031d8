package zmq

import (
	"bytes"
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
	"pgregory.net/rapid"
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
	storedFull := stored
	storedFull.HasGroup, storedFull.Kind = true, "full_attention"
	cases := []struct {
		name  string
		batch []any
		want  Batch
	}{
		{"positional vLLM, int hashes, dp rank", []any{1.5, []any{
			[]any{"BlockStored", []any{uint64(10), int64(-1)}, uint64(9), toks, 4, nil, "GPU", "ad", nil, 0, "full_attention", nil},
		}, 3}, Batch{Timestamp: 1.5, Events: []Event{storedFull}, HasDPRank: true, DPRank: 3}},
		{"positional with byte hashes and a publisher id", []any{2, []any{
			[]any{"BlockStored", []any{digest(10), digest(math.MaxUint64)}, digest(9), toks, 4, 7, "GPU", "ad"},
		}, nil, []byte{1, 2}}, Batch{Timestamp: 2, Events: []Event{stored}, PublisherID: []byte{1, 2}}},
		{"older SGLang: ends at lora_id", []any{0.0, []any{
			[]any{"BlockStored", []any{10}, nil, toks[:4], 4, nil},
		}}, Batch{Events: []Event{
			{Type: BlockStored, BlockHashes: []uint64{10}, TokenIDs: toks[:4], BlockSize: 4},
		}}},
		{"named events with unknown fields", []any{1.0, []any{
			map[string]any{"type": "BlockStored", "block_hashes": []any{10, int64(-1)}, "parent_block_hash": 9,
				"token_ids": toks, "block_size": 4, "lora_name": "ad", "medium": "GPU", "locality": "LOCAL",
				"session_id": "s", "extra_keys": []any{[]any{"mm", 1}}, "later": map[string]any{"a": []any{1}}},
			map[string]any{"type": "BlockRemoved", "block_hashes": []any{digest(10)}, "medium": nil, "group_idx": 2},
			map[string]any{"type": "AllBlocksCleared", "ownership": "kvcr"},
		}, 0, nil, "a fifth element"}, Batch{Timestamp: 1, HasDPRank: true, Events: []Event{
			{Type: BlockStored, BlockHashes: []uint64{10, math.MaxUint64}, HasParent: true, ParentHash: 9,
				TokenIDs: toks, BlockSize: 4, LoRAName: "ad", Medium: "GPU", Locality: "LOCAL"},
			{Type: BlockRemoved, BlockHashes: []uint64{10}, HasGroup: true, GroupIdx: 2},
			{Type: AllBlocksCleared, Ownership: "kvcr", HasOwnership: true},
		}}},
		// A tail shorter than four fields is read by kind (Dynamo
		// deserialize.rs parse_common_trailing): the string is a kind, not
		// a locality.
		{"positional removed and cleared, an unknown type", []any{1.0, []any{
			[]any{"BlockRemoved", []any{5, 6}, "CPU", 0, "x"},
			[]any{"AllBlocksCleared"},
			[]any{"AllBlocksCleared", "kvcr", "later"},
			[]any{"BlockUpdated", 1, 2},
		}}, Batch{Timestamp: 1, Events: []Event{
			{Type: BlockRemoved, BlockHashes: []uint64{5, 6}, Medium: "CPU", HasGroup: true, Kind: "x"},
			{Type: AllBlocksCleared},
			{Type: AllBlocksCleared, Ownership: "kvcr", HasOwnership: true},
			{Type: Unknown},
		}}},
		// The newest layout (vLLM and SGLang reserve every trailing slot):
		// group_idx, kind, sliding window, locality, ownership.
		{"positional full trailing tails", []any{1.0, []any{
			[]any{"BlockRemoved", []any{5}, nil, 3, "full_attention", nil, "LOCAL", "kvcr"},
			[]any{"BlockStored", []any{10}, nil, toks[:4], 4, nil, "GPU", nil, nil, 0, "full_attention", 64, "REMOTE", nil},
			[]any{"BlockRemoved", []any{5}, nil, nil, nil, nil, nil, nil},
		}}, Batch{Timestamp: 1, Events: []Event{
			{Type: BlockRemoved, BlockHashes: []uint64{5}, HasGroup: true, GroupIdx: 3, Kind: "full_attention", Locality: "LOCAL",
				Ownership: "kvcr", HasOwnership: true},
			{Type: BlockStored, BlockHashes: []uint64{10}, TokenIDs: toks[:4], BlockSize: 4, Medium: "GPU", HasGroup: true,
				Kind: "full_attention", Locality: "REMOTE"},
			{Type: BlockRemoved, BlockHashes: []uint64{5}},
		}}},
		// SGLang's own wire-format test (TestBlockStoredWireFormat, kv_events):
		// the salt in extra_keys, its metadata map parked at position 14,
		// and the reserved removal and clear tails.
		{"SGLang's positional layouts", []any{1.0, []any{
			[]any{"BlockStored", []any{123}, nil, []any{1, 2}, 2, nil, "GPU", nil, []any{[]any{"dynamo-cache-salt:tenant-a"}},
				nil, nil, nil, nil, nil, map[string]any{"cache_salt": "tenant-a"}},
			[]any{"BlockRemoved", []any{123}, nil, nil, nil, nil, nil, nil},
			[]any{"AllBlocksCleared", nil},
		}}, Batch{Timestamp: 1, Events: []Event{
			{Type: BlockStored, BlockHashes: []uint64{123}, TokenIDs: []uint32{1, 2}, BlockSize: 2, Medium: "GPU", Namespace: "tenant-a"},
			{Type: BlockRemoved, BlockHashes: []uint64{123}},
			{Type: AllBlocksCleared},
		}}},
		// Dynamo's test_deserialize_sequence_accepts_main_attention_kind_without_group_idx_slot
		// and a tail whose kinds do not fit the fixed layout: read by kind.
		{"positional tails read by kind", []any{1.0, []any{
			[]any{"BlockStored", []any{11}, nil, toks[:4], 4, nil, nil, nil, nil, "full_attention"},
			[]any{"BlockRemoved", []any{11}, nil, "full_attention"},
			[]any{"BlockRemoved", []any{11}, nil, 3, 128, "mamba", "LOCAL"},
		}}, Batch{Timestamp: 1, Events: []Event{
			{Type: BlockStored, BlockHashes: []uint64{11}, TokenIDs: toks[:4], BlockSize: 4, Kind: "full_attention"},
			{Type: BlockRemoved, BlockHashes: []uint64{11}, Kind: "full_attention"},
			{Type: BlockRemoved, BlockHashes: []uint64{11}, HasGroup: true, GroupIdx: 3, Kind: "LOCAL"},
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
		// Dynamo reads position 7 as lora_name: Option<String>; SGLang's
		// metadata map there fails its decode of the whole batch
		// (deserialize.rs, newest stored version; SGLang's own kv_events test
		// moved the salt to extra_keys for that reason).
		{"SGLang's positional metadata map at lora_name", []any{1.0, []any{[]any{"BlockStored", []any{11}, nil, toks, 4, nil, "GPU",
			map[string]any{"cache_salt": "x"}}}}, ReasonField},
		{"ownership a map", []any{1.0, []any{map[string]any{"type": "BlockRemoved", "block_hashes": []any{1}, "ownership": map[string]any{}}}}, ReasonField},
		{"cleared ownership an int", []any{1.0, []any{[]any{"AllBlocksCleared", 1}}}, ReasonField},
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
		_, err := NewDecoder(Limits{}).DecodeBatch(mp(t, []any{1.0, []any{[]any{"BlockRemoved", []any{1}, nil, nil, nil, v}}}))
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
		// Full trailing tails, ownership, marker-form multimodal keys.
		[]any{1.0, []any{
			[]any{"BlockStored", []any{1, 2}, nil, []any{1, 1, 3, 2, 2, 5, 1, 2}, 4, nil, "GPU", nil,
				[]any{[]any{"0000000000000007" + "000000000000000000000000000000000000000000000000"}, []any{[]any{"000000000000000a" + "000000000000000000000000000000000000000000000000", 0}}},
				0, "full_attention", nil, "LOCAL", nil},
			[]any{"BlockRemoved", []any{5}, nil, 3, "full_attention", nil, "LOCAL", "kvcr"},
			[]any{"AllBlocksCleared", "kvcr"},
		}},
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
			cv := Converter{Worker: 1, BlockSize: 4}
			if len(payload)%2 == 0 { // the placeholder rules too
				cv.ImageTokenID, cv.HasImageToken, cv.VideoTokenID, cv.HasVideoToken = 1, true, 2, len(payload)%4 == 0
			}
			_, _, _, _ = cv.Convert(&ev, b.DPRank, 1)
		}
		// Decoding is deterministic and the decoder reusable.
		again, err := d.DecodeBatch(payload)
		require.NoError(t, err)
		// Compare the timestamp by its bits: a NaN ts (testdata/fuzz) is
		// decoded the same both times but never equals itself.
		require.Equal(t, math.Float64bits(b.Timestamp), math.Float64bits(again.Timestamp))
		b.Timestamp, again.Timestamp = 0, 0
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
		require.GreaterOrEqual(t, m.Seq, EndOfReplay)
	})
}

// TestAppendTokenIDs_EqualsLibrary checks the hand-written token scan against
// msgpack/v5 itself: any sequence of msgpack values (every integer encoding
// at every width, plus non-integers) must be accepted exactly when the
// library reads each as an integer in uint32 range, with the same values and
// the same length consumed.
func TestAppendTokenIDs_EqualsLibrary(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var buf bytes.Buffer
		enc := msgpack.NewEncoder(&buf)
		n := rapid.IntRange(0, 12).Draw(t, "n")
		for i := range n {
			switch rapid.IntRange(0, 9).Draw(t, "kind") {
			case 0: // the compact form engines send
				require.NoError(t, enc.EncodeUint(rapid.Uint64Range(0, math.MaxUint32+2).Draw(t, "u")))
			case 1:
				require.NoError(t, enc.EncodeInt(rapid.Int64Range(-300, math.MaxUint32+2).Draw(t, "i")))
			case 2:
				require.NoError(t, enc.EncodeUint8(rapid.Uint8().Draw(t, "u8")))
			case 3:
				require.NoError(t, enc.EncodeUint16(rapid.Uint16().Draw(t, "u16")))
			case 4:
				require.NoError(t, enc.EncodeUint32(rapid.Uint32().Draw(t, "u32")))
			case 5:
				require.NoError(t, enc.EncodeUint64(rapid.Uint64().Draw(t, "u64")))
			case 6:
				require.NoError(t, enc.EncodeInt8(rapid.Int8().Draw(t, "i8")))
			case 7:
				require.NoError(t, enc.EncodeInt16(rapid.Int16().Draw(t, "i16")))
			case 8:
				require.NoError(t, enc.EncodeInt32(rapid.Int32().Draw(t, "i32")))
			default:
				if rapid.Bool().Draw(t, "string") {
					require.NoError(t, enc.EncodeString("x"))
				} else {
					require.NoError(t, enc.EncodeInt64(rapid.Int64().Draw(t, "i64")))
				}
			}
			_ = i
		}
		b := buf.Bytes()
		if cut := rapid.IntRange(0, 3).Draw(t, "cut"); cut > 0 && cut <= len(b) {
			b = b[:len(b)-cut] // sometimes truncated
		}

		want, wantUsed, ok := libraryTokenIDs(b, n)
		got, used, err := appendTokenIDs(nil, b, n)
		if !ok {
			require.Error(t, err)
			require.ErrorIs(t, err, ErrMalformed)
			return
		}
		require.NoError(t, err)
		require.Equal(t, want, append([]uint32(nil), got...))
		require.Equal(t, wantUsed, used)
	})
}

// libraryTokenIDs is the reference for appendTokenIDs: msgpack/v5 reading n
// integers value by value, with the uint32 range check.
func libraryTokenIDs(b []byte, n int) (ids []uint32, used int, ok bool) {
	rd := bytes.NewReader(b)
	dec := msgpack.NewDecoder(rd)
	for range n {
		c, err := dec.PeekCode()
		if err != nil || !isInt(c) {
			return nil, 0, false
		}
		v, err := dec.DecodeInt64()
		if err != nil || v < 0 || v > math.MaxUint32 {
			return nil, 0, false
		}
		ids = append(ids, uint32(v))
	}
	return ids, len(b) - rd.Len(), true
}

// FuzzAppendTokenIDs compares the token scan with the library on any bytes.
func FuzzAppendTokenIDs(f *testing.F) {
	f.Add([]byte{0x01, 0xcc, 0xff, 0xcd, 0x01, 0x00, 0xce, 0xff, 0xff, 0xff, 0xff}, uint8(4))
	f.Add([]byte{0xd0, 0x80, 0xd3, 0, 0, 0, 0, 0, 0, 0, 1, 0xcf, 0, 0, 0, 1, 0, 0, 0, 0}, uint8(3))
	f.Add([]byte{0xe0, 0xa1, 0x78, 0xc0}, uint8(1))
	f.Fuzz(func(t *testing.T, b []byte, n uint8) {
		want, wantUsed, ok := libraryTokenIDs(b, int(n))
		got, used, err := appendTokenIDs(nil, b, int(n))
		if !ok {
			require.ErrorIs(t, err, ErrMalformed)
			return
		}
		require.NoError(t, err)
		require.Equal(t, want, append([]uint32(nil), got...))
		require.Equal(t, wantUsed, used)
	})
}

// TestStringBytes_EqualsLibrary checks the in-place string read against
// msgpack/v5's DecodeString: same acceptance, same bytes, same length used.
func TestStringBytes_EqualsLibrary(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var buf bytes.Buffer
		enc := msgpack.NewEncoder(&buf)
		// Lengths on both sides of each header width (fixstr/str8, str8/str16,
		// str16/str32).
		n := rapid.OneOf(rapid.IntRange(0, 40), rapid.IntRange(250, 260), rapid.IntRange(65530, 65540)).Draw(t, "len")
		s := strings.Repeat(string(rune('a'+n%26)), n)
		switch rapid.IntRange(0, 4).Draw(t, "kind") {
		case 0:
			require.NoError(t, enc.EncodeString(s))
		case 1:
			require.NoError(t, enc.EncodeBytes([]byte(s)))
		case 2:
			require.NoError(t, enc.EncodeNil())
		case 3: // a wide header for a short string
			buf.WriteByte(0xdb)
			require.NoError(t, binary.Write(&buf, binary.BigEndian, uint32(len(s))))
			buf.WriteString(s)
		default:
			require.NoError(t, enc.EncodeInt(rapid.Int64().Draw(t, "i")))
		}
		b := buf.Bytes()
		if cut := rapid.IntRange(0, 2).Draw(t, "cut"); cut > 0 && cut <= len(b) {
			b = b[:len(b)-cut]
		}
		rd := bytes.NewReader(b)
		want, wantErr := msgpack.NewDecoder(rd).DecodeString()

		d := NewDecoder(Limits{})
		d.payload = b
		d.rd.Reset(b)
		got, err := d.stringBytes()
		if wantErr != nil {
			require.Error(t, err)
			return
		}
		require.NoError(t, err)
		require.Equal(t, want, string(got))
		require.Equal(t, rd.Len(), d.rd.Len())
	})
}

// TestHash_EqualsLibrary checks the block-hash read against msgpack/v5 read
// value by value (integers as their uint64 bits, bytes and strings by their
// last 8 bytes): same acceptance, same value, same length used.
func TestHash_EqualsLibrary(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var buf bytes.Buffer
		enc := msgpack.NewEncoder(&buf)
		switch rapid.IntRange(0, 7).Draw(t, "kind") {
		case 0:
			require.NoError(t, enc.EncodeUint(rapid.Uint64().Draw(t, "u")))
		case 1: // a full-width hash, as engines send
			require.NoError(t, enc.EncodeUint64(rapid.Uint64Range(math.MaxUint32, math.MaxUint64).Draw(t, "u64")))
		case 2:
			require.NoError(t, enc.EncodeInt(rapid.Int64Range(math.MinInt64, -1).Draw(t, "neg")))
		case 3:
			require.NoError(t, enc.EncodeInt8(rapid.Int8().Draw(t, "i8")))
		case 4:
			require.NoError(t, enc.EncodeBytes(rapid.SliceOfN(rapid.Byte(), 0, 40).Draw(t, "bin")))
		case 5:
			require.NoError(t, enc.EncodeString(rapid.StringN(0, 40, -1).Draw(t, "str")))
		case 6:
			require.NoError(t, enc.EncodeNil())
		default:
			require.NoError(t, enc.EncodeFloat64(1.5))
		}
		b := buf.Bytes()
		if cut := rapid.IntRange(0, 2).Draw(t, "cut"); cut > 0 && cut <= len(b) {
			b = b[:len(b)-cut]
		}

		// The reference: the library.
		rd := bytes.NewReader(b)
		lib := msgpack.NewDecoder(rd)
		want, ok := uint64(0), false
		if c, err := lib.PeekCode(); err == nil {
			switch {
			case isInt(c):
				var err error
				want, err = lib.DecodeUint64()
				ok = err == nil
			case msgpcode.IsBin(c) || msgpcode.IsString(c):
				raw, err := lib.DecodeBytes()
				if ok = err == nil && len(raw) > 0; ok {
					var w [8]byte
					copy(w[max(0, 8-len(raw)):], raw[max(0, len(raw)-8):])
					want = binary.BigEndian.Uint64(w[:])
				}
			}
		}

		d := NewDecoder(Limits{})
		d.payload = b
		d.rd.Reset(b)
		got, err := d.hash()
		if !ok {
			require.Error(t, err)
			return
		}
		require.NoError(t, err)
		require.Equal(t, want, got)
		require.Equal(t, rd.Len(), d.rd.Len())
	})
}
