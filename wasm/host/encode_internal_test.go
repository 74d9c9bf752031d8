package host

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// The bulk copies must write exactly the little-endian encoding, on either
// path (the loop runs on big-endian hosts, and here with the flag cleared).
func TestPutUints_LittleEndian(t *testing.T) {
	for _, le := range []bool{littleEndianHost, false} {
		saved := littleEndianHost
		littleEndianHost = le
		rapid.Check(t, func(t *rapid.T) {
			u32 := rapid.SliceOf(rapid.Uint32()).Draw(t, "u32")
			u64 := rapid.SliceOf(rapid.Uint64()).Draw(t, "u64")
			want32, want64 := []byte{}, []byte{}
			for _, x := range u32 {
				want32 = binary.LittleEndian.AppendUint32(want32, x)
			}
			for _, x := range u64 {
				want64 = binary.LittleEndian.AppendUint64(want64, x)
			}
			got32 := make([]byte, 4*len(u32)+3) // slack past the end stays untouched
			got64 := make([]byte, 8*len(u64)+5)
			putUint32s(got32, u32)
			putUint64s(got64, u64)
			require.Equal(t, append(want32, 0, 0, 0), got32)
			require.Equal(t, append(want64, 0, 0, 0, 0, 0), got64)
		})
		littleEndianHost = saved
	}
}
