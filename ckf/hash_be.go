//go:build !(386 || amd64 || amd64p32 || arm || arm64 || loong64 || mips64le || mips64p32le || mipsle || ppc64le || riscv || riscv64 || wasm)

package ckf

// localBlockHash encodes: on a big-endian target the tokens' memory is not
// the SPEC §3 byte order.
func localBlockHash(tokens []uint32, salt uint64) uint64 {
	return localBlockHashEncoded(tokens, salt)
}
