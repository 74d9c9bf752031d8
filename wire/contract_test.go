package wire_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/wire"
)

// TestDecodeFrame_FieldTypeDecisions pins SPEC §9's decision 9:
// unix_micros is an i64 of any sign, chunk_index and chunk_count are u32,
// and close reasons are an open set on the wire (a decoder keeps an unknown
// reason; the five defined ones are all a relay sends).
func TestDecodeFrame_FieldTypeDecisions(t *testing.T) {
	heartbeat := "96010494" + goldenIdentity + goldenLease + "12"
	chunk := "99010194" + goldenIdentity + goldenLease + "11"
	oneWord := "00" + "c408" + "0100000000000000" // offset 0, one word
	tests := []struct {
		name  string
		input string
		field string // "" = accepted
		check func(t *testing.T, f wire.Frame)
	}{
		{"unix_micros i64 min", heartbeat + "d38000000000000000", "", func(t *testing.T, f wire.Frame) {
			assert.Equal(t, int64(math.MinInt64), f.Heartbeat.UnixMicros)
		}},
		{"unix_micros i64 max as uint64", heartbeat + "cf7fffffffffffffff", "", func(t *testing.T, f wire.Frame) {
			assert.Equal(t, int64(math.MaxInt64), f.Heartbeat.UnixMicros)
		}},
		{"unix_micros above i64", heartbeat + "cf8000000000000000", "unix_micros", nil},
		{"chunk_count u32 max", chunk + "00" + "ceffffffff" + oneWord, "", func(t *testing.T, f wire.Frame) {
			assert.Equal(t, uint32(math.MaxUint32), f.Snapshot.ChunkCount)
		}},
		{"chunk_count above u32", chunk + "00" + "cf0000000100000000" + oneWord, "chunk_count", nil},
		{"unknown close reason kept", "940105" + "ad6675747572655f726561736f6e" + "a0", "", func(t *testing.T, f wire.Frame) {
			assert.Equal(t, wire.CloseReason("future_reason"), f.Close.Reason)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var f wire.Frame
			err := wire.DecodeFrame(mustHex(tt.input), &f)
			if tt.field != "" {
				var de *wire.DecodeError
				require.ErrorAs(t, err, &de)
				assert.ErrorIs(t, err, wire.ErrMalformed)
				assert.Equal(t, tt.field, de.Field)
				return
			}
			require.NoError(t, err)
			tt.check(t, f)
		})
	}
}
