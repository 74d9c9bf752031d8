package demo

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/sim/workload"
)

// The demo's engines send a trace block id as two tokens; the local block
// hash the relay computes from them must be the one the router queries.
func TestZMQDemo_TokensReproduceTheWorkloadHash(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 1000 {
		id := rng.Uint64()
		require.Equal(t, workload.TokensHash(id), ckf.LocalBlockHash([]uint32{uint32(id), uint32(id >> 32)}, ckf.BaseSalt))
	}
}
