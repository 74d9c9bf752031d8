package zmq

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
	"pgregory.net/rapid"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/sim/engine"
)

// mpUint appends v as the msgpack integer of the given form: 0 positive
// fixint, then msgpcode.Uint8 … Uint64 or Int8 … Int64 (v's bits, so a
// negative int is v's two's complement).
func mpUint(b []byte, form byte, v uint64) []byte {
	switch form {
	case 0:
		return append(b, byte(v))
	case msgpcode.Uint8, msgpcode.Int8:
		return append(b, form, byte(v))
	case msgpcode.Uint16, msgpcode.Int16:
		return binary.BigEndian.AppendUint16(append(b, form), uint16(v))
	case msgpcode.Uint32, msgpcode.Int32:
		return binary.BigEndian.AppendUint32(append(b, form), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, form), v)
}

// intForms are the msgpack integer forms, the fast paths' and the others.
var intForms = []byte{0, msgpcode.Uint8, msgpcode.Uint16, msgpcode.Uint32, msgpcode.Uint64,
	msgpcode.Int8, msgpcode.Int16, msgpcode.Int32, msgpcode.Int64}

// fits reports whether v can be written in form as a non-negative value.
func fits(form byte, v uint64) bool {
	switch form {
	case 0:
		return v <= uint64(msgpcode.PosFixedNumHigh)
	case msgpcode.Uint8:
		return v <= math.MaxUint8
	case msgpcode.Int8:
		return v <= math.MaxInt8
	case msgpcode.Uint16:
		return v <= math.MaxUint16
	case msgpcode.Int16:
		return v <= math.MaxInt16
	case msgpcode.Uint32:
		return v <= math.MaxUint32
	case msgpcode.Int32:
		return v <= math.MaxInt32
	case msgpcode.Int64:
		return v <= math.MaxInt64
	}
	return true
}

// arrayHeader appends a msgpack array header of n elements.
func arrayHeader(b []byte, n int) []byte {
	if n < 16 {
		return append(b, msgpcode.FixedArrayLow|byte(n))
	}
	return binary.BigEndian.AppendUint16(append(b, msgpcode.Array16), uint16(n))
}

// TestDecodeBatch_EveryIntegerFormReadsAlike: token ids and block hashes in
// every msgpack integer form, mixed within one array, decode to their
// values, whether the direct reads take them (positive fixint, uint8–32 for
// token ids; fixint, uint32, uint64 for hashes) or the general readers do
// (the others, from wherever the direct loop stopped). A token id beyond
// uint32 or a negative one rejects the batch, as before.
func TestDecodeBatch_EveryIntegerFormReadsAlike(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 40).Draw(t, "tokens")
		var toks []uint32
		body := arrayHeader(nil, n)
		for i := range n {
			v := uint64(rapid.Uint32().Draw(t, fmt.Sprint("tok", i)))
			if rapid.Bool().Draw(t, fmt.Sprint("small", i)) {
				v %= 300
			}
			var forms []byte
			for _, f := range intForms {
				if fits(f, v) {
					forms = append(forms, f)
				}
			}
			body = mpUint(body, rapid.SampledFrom(forms).Draw(t, fmt.Sprint("form", i)), v)
			toks = append(toks, uint32(v))
		}
		nh := rapid.IntRange(1, 6).Draw(t, "hashes")
		var hashes []uint64
		hb := arrayHeader(nil, nh)
		for i := range nh {
			v := rapid.Uint64().Draw(t, fmt.Sprint("hash", i))
			if rapid.Bool().Draw(t, fmt.Sprint("smallhash", i)) {
				v %= 1 << 33
			}
			var forms []byte
			for _, f := range intForms {
				if fits(f, v) {
					forms = append(forms, f)
				}
			}
			f := rapid.SampledFrom(forms).Draw(t, fmt.Sprint("hform", i))
			hb = mpUint(hb, f, v)
			hashes = append(hashes, v)
		}
		// [ts, [["BlockStored", hashes, nil, tokens, n]]]
		payload := append([]byte{0x92, 0x00, 0x91, 0x95, 0xab}, "BlockStored"...)
		payload = append(payload, hb...)
		payload = append(payload, msgpcode.Nil)
		payload = append(payload, body...)
		payload = mpUint(payload, 0, uint64(min(n, 127)))

		b, err := NewDecoder(Limits{}).DecodeBatch(payload)
		require.NoError(t, err)
		require.Len(t, b.Events, 1)
		assert.Equal(t, toks, b.Events[0].TokenIDs)
		assert.Equal(t, hashes, b.Events[0].BlockHashes)

		// The same batch with one token id out of range: rejected whole.
		bad := rapid.IntRange(0, n-1).Draw(t, "bad")
		var tail []byte
		if rapid.Bool().Draw(t, "negative") {
			tail = mpUint(nil, msgpcode.Int8, uint64(0xff)) // -1
		} else {
			tail = mpUint(nil, msgpcode.Uint64, math.MaxUint32+1)
		}
		body2 := arrayHeader(nil, n)
		for i, v := range toks {
			if i == bad {
				body2 = append(body2, tail...)
				continue
			}
			body2 = mpUint(body2, msgpcode.Uint32, uint64(v))
		}
		payload2 := append([]byte{0x92, 0x00, 0x91, 0x95, 0xab}, "BlockStored"...)
		payload2 = append(payload2, hb...)
		payload2 = append(payload2, msgpcode.Nil)
		payload2 = append(payload2, body2...)
		payload2 = mpUint(payload2, 0, uint64(min(n, 127)))
		_, err = NewDecoder(Limits{}).DecodeBatch(payload2)
		var de *DecodeError
		require.ErrorAs(t, err, &de)
		assert.Equal(t, ReasonField, de.Reason)
	})
}

// TestDecodeBatch_TruncatedInsideATokenIsMalformed: a payload cut inside a
// token id of each direct-read form is a typed rejection, not a panic or a
// short event.
func TestDecodeBatch_TruncatedInsideATokenIsMalformed(t *testing.T) {
	for _, form := range []byte{msgpcode.Uint8, msgpcode.Uint16, msgpcode.Uint32, msgpcode.Uint64} {
		payload := append([]byte{0x92, 0x00, 0x91, 0x95, 0xab}, "BlockStored"...)
		payload = append(payload, 0x91, 0x01, msgpcode.Nil, 0x92, 0x05)
		payload = mpUint(payload, form, 7)
		for cut := len(payload) - 1; cut > len(payload)-3; cut-- {
			_, err := NewDecoder(Limits{}).DecodeBatch(payload[:cut])
			require.ErrorIs(t, err, ErrMalformed, "form %#x cut at %d", form, cut)
		}
	}
}

// benchBatch is one batch of the ingest benchmark's shape: 64 Stored events
// × 4 blocks of 16 tokens, encoded by the engine emulator (positional).
func benchBatch(t testing.TB, firstToken uint32) []byte {
	e, err := engine.Start(engine.Config{Endpoint: fmt.Sprintf("inproc://fast-%d", firstToken), BlockSize: 16})
	require.NoError(t, err)
	defer e.Close()
	tok := firstToken
	var evs []engine.Event
	for i := range 64 {
		ev := engine.Event{Type: "BlockStored"}
		for j := range 4 {
			ev.BlockHashes = append(ev.BlockHashes, uint64(tok)<<8|uint64(i*4+j))
			for range 16 {
				tok++
				ev.TokenIDs = append(ev.TokenIDs, tok)
			}
		}
		evs = append(evs, ev)
	}
	payload, err := e.EncodeBatch(evs...)
	require.NoError(t, err)
	return payload
}

// TestDecodeBatch_AllocationsDoNotGrowWithEvents: a batch's token ids and
// block hashes are cut from shared chunks, so decoding a 64-event batch
// allocates a handful of times, not twice per event (129+ before).
func TestDecodeBatch_AllocationsDoNotGrowWithEvents(t *testing.T) {
	payload := benchBatch(t, 1<<20)
	d := NewDecoder(Limits{})
	_, err := d.DecodeBatch(payload) // the first batch has no size hint
	require.NoError(t, err)
	allocs := testing.AllocsPerRun(20, func() {
		if _, err := d.DecodeBatch(payload); err != nil {
			panic(err)
		}
	})
	assert.LessOrEqual(t, allocs, 4.0, "allocations per 64-event batch")
}

// TestConvert_BatchBlocksShareOneAllocation: after beginBatch the converted
// events' block slices come from one chunk, not one allocation each.
func TestConvert_BatchBlocksShareOneAllocation(t *testing.T) {
	b, err := NewDecoder(Limits{}).DecodeBatch(benchBatch(t, 1<<20))
	require.NoError(t, err)
	cv := Converter{Worker: 1, BlockSize: 16}
	var blocks int
	for i := range b.Events {
		blocks += len(b.Events[i].BlockHashes)
	}
	allocs := testing.AllocsPerRun(20, func() {
		cv.beginBatch(blocks)
		for i := range b.Events {
			if _, ok, _, _ := cv.Convert(&b.Events[i], 0, 1); !ok {
				panic("not converted")
			}
		}
	})
	assert.LessOrEqual(t, allocs, 1.0, "allocations per 64-event batch")
}

// TestDecodeBatch_BatchesOwnTheirSlices: the slices of a decoded batch are
// its own; decoding and converting the next batches does not change them
// (the actor may still hold a batch's events while the next is decoded).
func TestDecodeBatch_BatchesOwnTheirSlices(t *testing.T) {
	d := NewDecoder(Limits{})
	cv := Converter{Worker: 1, BlockSize: 16}
	first, err := d.DecodeBatch(benchBatch(t, 1<<20))
	require.NoError(t, err)
	cv.beginBatch(256)
	var blocks, blocksCopy [][]ckf.StoredBlock
	for i := range first.Events {
		out, ok, _, _ := cv.Convert(&first.Events[i], 0, 1)
		require.True(t, ok)
		blocks = append(blocks, out.Blocks)
		blocksCopy = append(blocksCopy, append([]ckf.StoredBlock(nil), out.Blocks...))
	}
	var want []Event
	for _, ev := range first.Events {
		c := ev
		c.TokenIDs = append([]uint32(nil), ev.TokenIDs...)
		c.BlockHashes = append([]uint64(nil), ev.BlockHashes...)
		want = append(want, c)
	}
	for k := range 3 {
		next, err := d.DecodeBatch(benchBatch(t, uint32(k+2)<<20))
		require.NoError(t, err)
		cv.beginBatch(256)
		for i := range next.Events {
			_, ok, _, _ := cv.Convert(&next.Events[i], 0, 1)
			require.True(t, ok)
		}
	}
	assert.Equal(t, want, first.Events)
	assert.Equal(t, blocksCopy, blocks)
}

// TestDecodeBatch_ChunksBoundedByThePayload: the chunk size a batch
// inherits from the previous one is bounded by its own payload, so a large
// batch followed by a tiny one does not make the tiny one reserve the large
// one's memory (a hostile engine alternating them holds at most what each
// payload could fill).
func TestDecodeBatch_ChunksBoundedByThePayload(t *testing.T) {
	event := func(tokens int) []byte {
		b := append([]byte{0x95, 0xab}, "BlockStored"...)
		b = append(b, 0x91, 0x01, msgpcode.Nil)
		b = arrayHeaderLong(b, tokens)
		for range tokens {
			b = append(b, 0x07) // one byte per token id
		}
		return append(b, 0x10)
	}
	var big []byte
	big = append(big, 0x92, 0x00, msgpcode.Array16, 0, 64)
	for range 64 {
		big = append(big, event(16384)...)
	}
	small := append([]byte{0x92, 0x00, 0x91}, event(16)...)

	d := NewDecoder(Limits{})
	_, err := d.DecodeBatch(big) // 1 M token ids: the next batch's hint
	require.NoError(t, err)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	b, err := d.DecodeBatch(small)
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	require.Len(t, b.Events[0].TokenIDs, 16)
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(16<<10),
		"bytes allocated for a %d-byte batch after a 1 M-token one", len(small))
}

// arrayHeaderLong appends an array32 header of n elements.
func arrayHeaderLong(b []byte, n int) []byte {
	return binary.BigEndian.AppendUint32(append(b, msgpcode.Array32), uint32(n))
}
