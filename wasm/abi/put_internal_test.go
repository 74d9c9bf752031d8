package abi

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// The bulk copies must write exactly the little-endian encoding, on either
// path (the loop runs on big-endian hosts, and here with the flag cleared),
// and nothing past it.
func TestPutUints_LittleEndian(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	saved := littleEndianHost
	t.Cleanup(func() { littleEndianHost = saved })
	for _, le := range []bool{saved, false} {
		littleEndianHost = le
		for _, n := range []int{0, 1, 2, 7, 64, 1000} {
			u32 := make([]uint32, n)
			u64 := make([]uint64, n)
			want32, want64 := []byte{}, []byte{}
			for i := range n {
				u32[i], u64[i] = rng.Uint32(), rng.Uint64()
				want32 = binary.LittleEndian.AppendUint32(want32, u32[i])
				want64 = binary.LittleEndian.AppendUint64(want64, u64[i])
			}
			got32 := make([]byte, 4*n+3)
			got64 := make([]byte, 8*n+5)
			PutUint32s(got32, u32)
			PutUint64s(got64, u64)
			require.Equal(t, append(want32, 0, 0, 0), got32, "u32, n=%d le=%v", n, le)
			require.Equal(t, append(want64, 0, 0, 0, 0, 0), got64, "u64, n=%d le=%v", n, le)
		}
	}
}
