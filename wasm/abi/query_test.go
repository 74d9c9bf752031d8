package abi_test

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wasm/abi"
)

func TestTokenQuery_RoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tokens []uint32
		o      ckf.HashOptions
		size   int
	}{
		{"empty", nil, ckf.HashOptions{}, 16},
		{"tokens only, padded to 8", []uint32{1, 2, 3}, ckf.HashOptions{}, 16 + 12 + 4},
		{"eagle", []uint32{1, 2, 3, 4, 5}, ckf.HashOptions{Eagle: true}, 16 + 20 + 4},
		{"lists, padded to 8", []uint32{1, 2, 3, 4}, ckf.HashOptions{MM: [][]uint64{{}, {9, 1 << 63}}}, 16 + 16 + 8 + 16},
		{"lists, no padding", []uint32{1, 2, 3}, ckf.HashOptions{MM: [][]uint64{{7}}}, 16 + 12 + 4 + 8},
		{"eagle and lists", []uint32{1, 2, 3, 4, 5}, ckf.HashOptions{Eagle: true, MM: [][]uint64{{5}, {6, 7}, {}}}, 16 + 20 + 12 + 0 + 24},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.size, abi.TokenQuerySize(len(tc.tokens), tc.o))
			b := abi.AppendTokenQuery([]byte{0xee}, tc.tokens, tc.o)
			require.Len(t, b, 1+tc.size)
			assert.Equal(t, byte(0xee), b[0], "the prefix is kept")
			tokens, o, err := abi.DecodeTokenQuery(b[1:])
			require.NoError(t, err)
			assert.Equal(t, len(tc.tokens), len(tokens))
			for i := range tc.tokens {
				assert.Equal(t, tc.tokens[i], tokens[i])
			}
			assert.Equal(t, tc.o.Eagle, o.Eagle)
			require.Len(t, o.MM, len(tc.o.MM))
			for i := range tc.o.MM {
				assert.Equal(t, len(tc.o.MM[i]), len(o.MM[i]), "list %d", i)
				for j := range tc.o.MM[i] {
					assert.Equal(t, tc.o.MM[i][j], o.MM[i][j], "list %d hash %d", i, j)
				}
			}
			q, err := abi.ParseTokenQuery(b[1:])
			require.NoError(t, err)
			assert.Zero(t, (16+len(q.Tokens)+len(q.Lengths)+7)&^7%8, "the hashes start 8-aligned")
		})
	}
}

func TestParseTokenQuery_Rejects(t *testing.T) {
	valid := abi.AppendTokenQuery(nil, []uint32{1, 2, 3}, ckf.HashOptions{MM: [][]uint64{{4, 5}, {6}}})
	edit := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(valid)) }
	put := func(at int, v uint32) func(b []byte) []byte {
		return func(b []byte) []byte { binary.LittleEndian.PutUint32(b[at:], v); return b }
	}
	_, _, err := abi.DecodeTokenQuery(valid)
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"nil", nil},
		{"short header", valid[:15]},
		{"unknown flag", edit(put(0, 2))},
		{"high flag", edit(put(0, 1<<31|1))},
		{"one byte short", valid[:len(valid)-1]},
		{"one byte long", append(bytes.Clone(valid), 0)},
		{"a token more than the bytes", edit(put(4, 4))},
		{"huge token count", edit(put(4, 1<<32-1))},
		{"more lists than the bytes", edit(put(8, 5))},
		{"n_mm above the lengths' sum", edit(func(b []byte) []byte {
			b = append(b, make([]byte, 8)...)
			binary.LittleEndian.PutUint32(b[12:], 4)
			return b
		})},
		{"lengths above n_mm", edit(put(16+12, 3))},
		{"non-zero padding", edit(func(b []byte) []byte { b[16+12+8] = 1; return b })},
	} {
		_, err := abi.ParseTokenQuery(tc.b)
		assert.ErrorIs(t, err, abi.ErrTokenQuery, tc.name)
	}
}

// FuzzParseTokenQuery: no input panics, and whatever parses re-encodes to
// the same bytes (one encoding per request).
func FuzzParseTokenQuery(f *testing.F) {
	f.Add(abi.AppendTokenQuery(nil, []uint32{1, 2, 3}, ckf.HashOptions{Eagle: true, MM: [][]uint64{{4, 5}, nil, {6}}}))
	f.Add(abi.AppendTokenQuery(nil, nil, ckf.HashOptions{}))
	f.Add([]byte{0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		tokens, o, err := abi.DecodeTokenQuery(b)
		if err != nil {
			require.ErrorIs(t, err, abi.ErrTokenQuery)
			return
		}
		require.Equal(t, b, abi.AppendTokenQuery(nil, tokens, o))
	})
}
