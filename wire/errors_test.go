package wire_test

import (
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/wire"
)

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

func TestDecodeFrame_Errors(t *testing.T) {
	delta := goldenFrames["delta"]
	tests := []struct {
		name  string
		input string
		want  error
		field string
	}{
		{"empty", "", wire.ErrTruncated, "frame"},
		{"not an array", "a3616263", wire.ErrMalformed, "frame"},
		{"array too short", "9101", wire.ErrMalformed, "frame"},
		{"version 2", "940203932a050912", wire.ErrUnknownVersion, "version"},
		{"version 0", "940003932a050912", wire.ErrUnknownVersion, "version"},
		{"version not int", "94c003932a050912", wire.ErrMalformed, "version"},
		{"kind 0", "940100932a050912", wire.ErrUnknownKind, "kind"},
		{"kind 6", "940106932a050912", wire.ErrUnknownKind, "kind"},
		{"kind 259", "9401cd0103932a050912", wire.ErrUnknownKind, "kind"},
		{"wrong element count", "950103932a05091200", wire.ErrMalformed, "frame"},
		{"lease of 2", "940103922a0512", wire.ErrMalformed, "lease"},
		{"lane above u8", "940103932acd01000912", wire.ErrMalformed, "lease"},
		{"negative sequence", "940103932a0509ff", wire.ErrMalformed, "expected_sequence"},
		{"negative int8 sequence", "940103932a0509d0fe", wire.ErrMalformed, "expected_sequence"},
		{"float sequence", "940103932a0509cb3ff0000000000000", wire.ErrMalformed, "expected_sequence"},
		{"truncated uint64", "940103932a0509cf0000", wire.ErrTruncated, "expected_sequence"},
		{"truncated after lease", "940103932a0509", wire.ErrTruncated, "expected_sequence"},
		{"trailing byte", "940103932a05091200", wire.ErrTrailingBytes, ""},
		{"array32 header truncated", "dd0000", wire.ErrTruncated, "frame"},
		{"close reason as bin", "940105c4016100", wire.ErrMalformed, "reason"},
		{"close message str8 beyond input", "940105a161d9ff41", wire.ErrTruncated, "message"},
		{"close str32 huge length", "940105a161dbffffffff", wire.ErrTruncated, "message"},
		{"delta images not multiple of 12", delta[:len(delta)-52] + "c40b" + "0000000000000000000000", wire.ErrMalformed, "images"},
		{"delta images bin32 huge", delta[:len(delta)-52] + "c6ffffff00", wire.ErrTruncated, "images"},
		{"delta images as str", delta[:len(delta)-52] + "a0", wire.ErrMalformed, "images"},
		{"delta truncated payload", delta[:len(delta)-2], wire.ErrTruncated, "images"},
		{"delta trailing", delta + "c0", wire.ErrTrailingBytes, ""},
		{"digest of 15 bytes", "97010294" + "95" + "c40f" + "0102030405060708090a0b0c0d0e0f", wire.ErrMalformed, "identity.pool_id.sem_digest"},
		{"digest source 2", "97010294" + "95" + "c410" + "0102030405060708090a0b0c0d0e0f10" + "02", wire.ErrMalformed, "identity.pool_id.sem_source"},
		{"identity of 3", "97010293", wire.ErrMalformed, "identity"},
		{"format version above u8", "97010294" + goldenIdentity[:len(goldenIdentity)-len("95"+"01"+"cf5deece66d1b54a33"+"cd0400"+"10"+"04")] + "95cd0100", wire.ErrMalformed, "identity.format.format_version"},
		{"chunk count 0", "99010194" + goldenIdentity + goldenLease + "110100", wire.ErrMalformed, "chunk_count"},
		{"chunk index = count", "99010194" + goldenIdentity + goldenLease + "110303", wire.ErrMalformed, "chunk_count"},
		{"chunk index above u32", "99010194" + goldenIdentity + goldenLease + "11cf0000000100000000", wire.ErrMalformed, "chunk_index"},
		{"words not multiple of 8", "99010194" + goldenIdentity + goldenLease + "11000100" + "c407" + "00000000000000", wire.ErrMalformed, "words"},
		{"offset overflow", "99010194" + goldenIdentity + goldenLease + "110001cfffffffffffffffff" + "c408" + "0000000000000000", wire.ErrMalformed, "words"},
		{"reserved byte", "940103932a0509c1", wire.ErrMalformed, "expected_sequence"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := mustHex(tt.input)
			f := sampleFrames()["close"]
			before := f
			err := wire.DecodeFrame(in, &f)
			require.ErrorIs(t, err, tt.want)
			var de *wire.DecodeError
			require.ErrorAs(t, err, &de)
			assert.Equal(t, tt.field, de.Field, "field of %v", err)
			assert.GreaterOrEqual(t, de.Offset, 0, "offset")
			assert.LessOrEqual(t, de.Offset, len(in), "offset")
			assert.Equal(t, before, f, "frame changed on error")
		})
	}
}

// TestDecodeFrame_ErrorsDoNotTouchBuffers checks that a frame that fails in
// its last element (trailing bytes after the words) does not overwrite the
// caller's reusable Words buffer.
func TestDecodeFrame_ErrorsDoNotTouchBuffers(t *testing.T) {
	snap := sampleFrames()["snapshot_chunk"]
	b, _ := wire.AppendFrame(nil, &snap)
	words := []uint64{9, 9, 9, 9}
	f := wire.Frame{Snapshot: wire.SnapshotChunk{Words: words[:0]}}
	err := wire.DecodeFrame(append(b, 0), &f)
	require.ErrorIs(t, err, wire.ErrTrailingBytes)
	require.Equal(t, []uint64{9, 9, 9, 9}, words, "caller buffer overwritten")
}

func TestDecodeError_Message(t *testing.T) {
	err := wire.DecodeFrame(mustHex("940103932a0509ff"), new(wire.Frame))
	want := "wire: malformed input at offset 7 in drain_marker frame (expected_sequence): negative value -1"
	require.EqualError(t, err, want)
}

// A JSON value of the wrong type is named by what belongs there, not by the
// decoder's Go types.
func TestJSONTypeError_SpeaksOfTheInput(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"worker_id": 1}`, "JSON object where an array belongs"},
		{`[{"worker_id": "7", "event": {"event_id": 1, "data": "cleared"}}]`, "JSON string where an unsigned integer belongs"},
		{`[{"worker_id": 7, "event": []}]`, "JSON array where an object belongs"},
	} {
		_, err := wire.DecodeRouterEventsJSON([]byte(tc.in), nil)
		require.Error(t, err, tc.in)
		assert.Contains(t, err.Error(), tc.want, tc.in)
		assert.NotContains(t, err.Error(), "wire.", tc.in)
		assert.NotContains(t, err.Error(), "[]", tc.in)
	}
}
