package replica

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/producer"
)

func sampleCommands() []Command {
	stored := ckf.RouterEvent{WorkerID: 7, DPRank: 2, EventID: 99, Kind: ckf.EventStored,
		HasParent: true, ParentHash: 1 << 63, HasStartPosition: true, StartPosition: 4,
		Blocks: []ckf.StoredBlock{{BlockHash: 1, TokensHash: 2}, {BlockHash: 3, TokensHash: 1<<64 - 1}}}
	removed := ckf.RouterEvent{WorkerID: 7, DPRank: 2, EventID: 100, Kind: ckf.EventRemoved, StorageTier: ckf.TierDisk,
		BlockHashes: []uint64{1, 3}}
	cleared := ckf.RouterEvent{WorkerID: 1<<64 - 1, DPRank: 1<<32 - 1, EventID: 0, Kind: ckf.EventCleared}
	return []Command{
		{Kind: KindAdmitted, SourceEpoch: 5, Event: stored},
		{Kind: KindAdmitted, SourceEpoch: 5, Event: removed},
		{Kind: KindReset, SourceEpoch: 6, Member: ckf.Member{WorkerID: 7, DPRank: 2}, Degraded: true},
		{Kind: KindReplaced, Reps: []producer.RankReplacement{
			{SourceEpoch: 8, Member: ckf.Member{WorkerID: 9}, Events: []ckf.RouterEvent{stored, cleared}},
			{SourceEpoch: 1, Member: ckf.Member{WorkerID: 10, DPRank: 1}},
		}},
		{Kind: KindAdmitted, SourceEpoch: 0, Event: cleared},
		{Kind: KindCursor, Cursor: producer.Cursor{Source: "tcp://engine-0:5557#0", Seq: 1<<64 - 1}},
		{Kind: KindCursor, Cursor: producer.Cursor{}},
	}
}

func TestBatchRoundTrip(t *testing.T) {
	cmds := sampleCommands()
	b, err := AppendBatch(nil, 12345, cmds)
	require.NoError(t, err)
	got, err := DecodeBatch(b)
	require.NoError(t, err)
	assert.Equal(t, uint64(12345), got.Position)
	// A replacement's rank with no events decodes with an empty (not nil)
	// slice; compare element-wise on what the actor reads.
	require.Len(t, got.Commands, len(cmds))
	for i := range cmds {
		w, g := cmds[i], got.Commands[i]
		if w.Kind == KindReplaced {
			require.Len(t, g.Reps, len(w.Reps))
			for j := range w.Reps {
				assert.Equal(t, w.Reps[j].SourceEpoch, g.Reps[j].SourceEpoch)
				assert.Equal(t, w.Reps[j].Member, g.Reps[j].Member)
				assert.Equal(t, len(w.Reps[j].Events), len(g.Reps[j].Events))
				for k := range w.Reps[j].Events {
					assert.Equal(t, w.Reps[j].Events[k], g.Reps[j].Events[k])
				}
			}
			continue
		}
		assert.Equal(t, w, g, "command %d", i)
	}
	// Every strict prefix is refused as corrupt, never decoded short.
	for n := range len(b) {
		_, err := DecodeBatch(b[:n])
		require.ErrorIs(t, err, ErrCorrupt, "prefix %d", n)
	}
}

func TestBatchIsCompact(t *testing.T) {
	// A 16-block stored event (a typical prefix) against its JSON size in
	// package wire (~1.1 KB): the binary record is 16 bytes a block plus a
	// few bytes of ids.
	ev := ckf.RouterEvent{WorkerID: 123456, DPRank: 3, EventID: 987654, Kind: ckf.EventStored,
		HasParent: true, ParentHash: 0xdeadbeefcafef00d}
	for i := range 16 {
		ev.Blocks = append(ev.Blocks, ckf.StoredBlock{BlockHash: uint64(i) * 0x9E3779B97F4A7C15, TokensHash: ^uint64(i)})
	}
	b, err := AppendBatch(nil, 0, []Command{{Kind: KindAdmitted, SourceEpoch: 1, Event: ev}})
	require.NoError(t, err)
	assert.LessOrEqual(t, len(b), 16*16+30)
}

func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range []Header{
		{Type: TypeBatch, Term: 1, Prev: 0},
		{Type: TypeBatch, More: true, Term: 1 << 40, Prev: 1<<64 - 1},
		{Type: TypeTerm, Term: 77, Prev: 12},
	} {
		b := AppendHeader(nil, h)
		b = append(b, "body"...)
		m, err := DecodeMessage(b)
		require.NoError(t, err)
		assert.Equal(t, h, m.Header)
		assert.Equal(t, "body", string(m.Body))
	}
	tr := TermRecord{Node: "relay-a", Address: "http://10.0.0.1:8080"}
	got, err := DecodeTerm(AppendTerm(nil, tr))
	require.NoError(t, err)
	assert.Equal(t, tr, got)
}

func TestDecodeRefusals(t *testing.T) {
	valid := AppendHeader(nil, Header{Type: TypeBatch, Term: 1})
	cases := map[string][]byte{
		"empty":        nil,
		"magic":        append([]byte("XR"), valid[2:]...),
		"version":      {magic0, magic1, 9, 'B', 0, 1, 0},
		"type":         {magic0, magic1, version, 'Z', 0, 1, 0},
		"flags":        {magic0, magic1, version, 'B', 0x80, 1, 0},
		"term flags":   {magic0, magic1, version, 'T', flagMore, 1, 0},
		"short varint": {magic0, magic1, version, 'B', 0, 0x80},
	}
	for name, b := range cases {
		_, err := DecodeMessage(b)
		assert.ErrorIs(t, err, ErrCorrupt, name)
	}
	batches := map[string][]byte{
		"count beyond input": {0, 200},
		"unknown command":    {0, 1, 'z'},
		"event kind 0":       {0, 1, 'a', 1, 1, 0, 0, 0, 0, 0, 0, 0},
		"event tier 4":       {0, 1, 'a', 1, 1, 0, 0, 1, 4, 0, 0, 0},
		"event flags":        {0, 1, 'a', 1, 1, 0, 0, 1, 0, 4, 0, 0},
		"empty replacement":  {0, 1, 'p', 0},
		"degraded flag 2":    {0, 1, 'r', 1, 1, 0, 2},
		"rank beyond 32 bit": {0, 1, 'r', 1, 1, 0x80, 0x80, 0x80, 0x80, 0x10, 0},
		"trailing":           {0, 0, 0},
		"blocks beyond":      {0, 1, 'a', 1, 1, 0, 0, 1, 0, 0, 100, 0},
	}
	for name, b := range batches {
		_, err := DecodeBatch(b)
		assert.ErrorIs(t, err, ErrCorrupt, name)
	}
	_, err := DecodeTerm([]byte{0xff, 0xff, 0x03})
	assert.ErrorIs(t, err, ErrCorrupt)
	_, err = AppendBatch(nil, 0, []Command{{Kind: 'x'}})
	assert.Error(t, err)
	assert.False(t, errors.Is(err, ErrCorrupt))
}

// FuzzDecode: no input panics or allocates beyond its bound, and what
// decodes re-encodes to the same bytes.
func FuzzDecode(f *testing.F) {
	b, _ := AppendBatch(nil, 3, sampleCommands())
	f.Add(b)
	f.Add(AppendHeader(nil, Header{Type: TypeTerm, Term: 3, Prev: 4}))
	f.Add([]byte{0, 1, 'p', 1, 1, 1, 1, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		if m, err := DecodeMessage(b); err == nil {
			m2, err := DecodeMessage(AppendHeader(nil, m.Header))
			require.NoError(t, err)
			assert.Equal(t, m.Header, m2.Header)
			if m.Type == TypeTerm {
				if tr, err := DecodeTerm(m.Body); err == nil {
					tr2, err := DecodeTerm(AppendTerm(nil, tr))
					require.NoError(t, err)
					assert.Equal(t, tr, tr2)
				}
			}
		}
		bt, err := DecodeBatch(b)
		if err != nil {
			require.ErrorIs(t, err, ErrCorrupt)
			return
		}
		again, err := AppendBatch(nil, bt.Position, bt.Commands)
		require.NoError(t, err)
		// Varints have one shortest form; a longer one decodes too, so
		// compare by decoding again.
		bt2, err := DecodeBatch(again)
		require.NoError(t, err)
		assert.Equal(t, bt, bt2)
	})
}

// BenchmarkBatchCodec encodes and decodes a batch of 256 admitted 16-block
// events (a busy leader's round trip).
func BenchmarkBatchCodec(b *testing.B) {
	cmds := make([]Command, 256)
	for i := range cmds {
		ev := ckf.RouterEvent{WorkerID: uint64(i % 8), DPRank: 1, EventID: uint64(i), Kind: ckf.EventStored, HasParent: true, ParentHash: uint64(i)}
		for j := range 16 {
			ev.Blocks = append(ev.Blocks, ckf.StoredBlock{BlockHash: uint64(i*16+j) * 0x9E3779B97F4A7C15, TokensHash: uint64(j)})
		}
		cmds[i] = Command{Kind: KindAdmitted, SourceEpoch: 1, Event: ev}
	}
	buf, err := AppendBatch(nil, 0, cmds)
	require.NoError(b, err)
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		buf, _ = AppendBatch(buf[:0], 0, cmds)
		if _, err := DecodeBatch(buf); err != nil {
			require.Fail(b, err.Error())
		}
	}
	b.ReportMetric(float64(len(buf))/(256*16), "bytes/block")
}
