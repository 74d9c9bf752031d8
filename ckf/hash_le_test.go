//go:build 386 || amd64 || amd64p32 || arm || arm64 || loong64 || mips64le || mips64p32le || mipsle || ppc64le || riscv || riscv64 || wasm

package ckf

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestLocalBlockHash_InPlaceDoesNotAllocate(t *testing.T) {
	tokens := make([]uint32, 1024)
	for _, n := range []int{16, 1024} {
		allocs := testing.AllocsPerRun(100, func() { _ = LocalBlockHash(tokens[:n], BaseSalt) })
		assert.Equal(t, float64(0), allocs, "LocalBlockHash(%d tokens) allocates %v times per call, want 0", n, allocs)
	}
}
