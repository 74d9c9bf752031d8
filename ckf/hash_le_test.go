//go:build 386 || amd64 || amd64p32 || arm || arm64 || loong64 || mips64le || mips64p32le || mipsle || ppc64le || riscv || riscv64 || wasm

package ckf

import "testing"

func TestLocalBlockHash_InPlaceDoesNotAllocate(t *testing.T) {
	tokens := make([]uint32, 1024)
	for _, n := range []int{16, 1024} {
		if allocs := testing.AllocsPerRun(100, func() { _ = LocalBlockHash(tokens[:n], BaseSalt) }); allocs != 0 {
			t.Errorf("LocalBlockHash(%d tokens) allocates %v times per call, want 0", n, allocs)
		}
	}
}
