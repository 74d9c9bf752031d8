package cbi1_test

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/wire/cbi1"
)

// FuzzDecode checks that Decode never panics and that every frame it
// accepts re-encodes to exactly its input (every byte of a CBI1 frame is
// determined by the decoded fields). Seeds are the golden frames; the
// fuzzer's checksum is usually wrong, so each input is also tried with its
// checksum resealed to reach the body checks.
func FuzzDecode(f *testing.F) {
	f.Add(golden(nil, goldenDelta))
	f.Add(golden(nil, goldenEmptyDelta))
	f.Add(golden(nil, goldenReadmeChunk))
	f.Add([]byte("CBI1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		check := func(in []byte) {
			var fr cbi1.Frame
			err := cbi1.Decode(in, &fr)
			// DecodeFor the frame's own format is Decode; for another
			// format it is a format error whenever Decode got past the
			// format's own checks (Dynamo's order: before flags and body).
			var own, other cbi1.Frame
			if err == nil {
				require.NoError(t, cbi1.DecodeFor(in, fr.Format, &own))
				require.Equal(t, fr, own)
			}
			errOther := cbi1.DecodeFor(in, dynamoFormat, &other)
			pastFormat := err == nil || errors.Is(err, cbi1.ErrFlags) || errors.Is(err, cbi1.ErrMalformed) || errors.Is(err, cbi1.ErrLimitExceeded)
			switch {
			case pastFormat && (binary.LittleEndian.Uint64(in[12:]) != dynamoFormat.Seed ||
				binary.LittleEndian.Uint64(in[20:]) != dynamoFormat.BucketCount):
				// Past the format's own checks, in another format: the
				// expected format decides, before the flags and the body.
				require.ErrorIs(t, errOther, cbi1.ErrFormat)
			case err == nil:
				require.NoError(t, errOther)
				require.Equal(t, fr, other)
			default:
				require.ErrorIs(t, errOther, errors.Unwrap(err), "the same class as Decode")
			}
			if err != nil {
				return
			}
			out, err := cbi1.AppendFrame(nil, &fr)
			require.NoError(t, err)
			require.Equal(t, in, out)
		}
		check(b)
		if len(b) >= cbi1.HeaderLen {
			sealed := append([]byte(nil), b...)
			check(reseal(sealed))
			// And as a delta and a chunk of a valid 1024-bucket format.
			for _, kind := range []uint16{1, 2} {
				copy(sealed, golden(nil, goldenEmptyDelta)[:44])
				binary.LittleEndian.PutUint16(sealed[6:], kind)
				check(reseal(sealed))
			}
		}
	})
}
