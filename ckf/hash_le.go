//go:build 386 || amd64 || amd64p32 || arm || arm64 || loong64 || mips64le || mips64p32le || mipsle || ppc64le || riscv || riscv64 || wasm

package ckf

import (
	"unsafe"

	"github.com/zeebo/xxh3"
)

// localBlockHash hashes the tokens' own memory: on a little-endian target a
// []uint32 already is the SPEC §3 byte sequence (little-endian u32s), so a
// byte view of it needs no encoding, no buffer and no zeroing. The view is
// valid Go: byte alignment (1) divides uint32 alignment, the length is exact,
// and xxh3 only reads it.
func localBlockHash(tokens []uint32, salt uint64) uint64 {
	b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(tokens))), 4*len(tokens))
	return xxh3.HashSeed(b, salt)
}
