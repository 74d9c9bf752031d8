//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package host

import (
	"syscall"

	"github.com/tetratelabs/wazero/experimental"
)

// mmapAllocator backs each linear memory with one anonymous mapping of its
// maximum size, reserved with MAP_NORESERVE: growth only changes the slice
// length, so it never copies and host views of guest memory stay valid
// across calls. Untouched pages cost address space only (docs/RATIONALE.md,
// "Why is the wasm consumer shaped the way it is?").
func newAllocator() experimental.MemoryAllocator {
	return experimental.MemoryAllocatorFunc(func(capacity, maximum uint64) experimental.LinearMemory {
		size := (max(maximum, capacity, 1) + pageSize - 1) &^ (pageSize - 1)
		b, err := syscall.Mmap(-1, 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE,
			syscall.MAP_PRIVATE|syscall.MAP_ANON|syscall.MAP_NORESERVE)
		if err != nil {
			return &sliceMemory{} // the copying fallback still works
		}
		return &mmapMemory{buf: b}
	})
}

const pageSize = 1 << 16

type mmapMemory struct{ buf []byte }

func (m *mmapMemory) Reallocate(size uint64) []byte {
	if size > uint64(len(m.buf)) {
		return nil
	}
	return m.buf[:size:size]
}

func (m *mmapMemory) Free() {
	if m.buf != nil {
		_ = syscall.Munmap(m.buf)
		m.buf = nil
	}
}
