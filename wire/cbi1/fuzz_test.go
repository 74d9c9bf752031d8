package cbi1_test

import (
	"encoding/binary"
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
			if err := cbi1.Decode(in, &fr); err != nil {
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
