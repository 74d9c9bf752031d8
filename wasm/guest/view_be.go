//go:build !(386 || amd64 || amd64p32 || arm || arm64 || loong64 || mips64le || mips64p32le || mipsle || ppc64le || riscv || riscv64 || wasm)

package main

import (
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wasm/abi"
)

// uint64s decodes the little-endian uint64s of b into *scratch.
func uint64s(b []byte, scratch *[]uint64) []uint64 { return decodeUint64s(b, scratch) }

// uint32s decodes the little-endian uint32s of b into *scratch.
func uint32s(b []byte, scratch *[]uint32) []uint32 { return decodeUint32s(b, scratch) }

// putQueryRecord writes the query record field by field.
func putQueryRecord(out []byte, r *consumer.QueryResult) { abi.PutQueryRecord(out, r) }
