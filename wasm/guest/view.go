package main

import "encoding/binary"

func decodeUint64s(b []byte, scratch *[]uint64) []uint64 {
	s := (*scratch)[:0]
	for i := 0; i+8 <= len(b); i += 8 {
		s = append(s, binary.LittleEndian.Uint64(b[i:]))
	}
	*scratch = s
	return s
}

func decodeUint32s(b []byte, scratch *[]uint32) []uint32 {
	s := (*scratch)[:0]
	for i := 0; i+4 <= len(b); i += 4 {
		s = append(s, binary.LittleEndian.Uint32(b[i:]))
	}
	*scratch = s
	return s
}
