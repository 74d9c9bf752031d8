//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package host

import "github.com/tetratelabs/wazero/experimental"

// newAllocator returns the copying allocator where no mmap is available:
// growth copies the memory, and host views are re-read after every call.
func newAllocator() experimental.MemoryAllocator {
	return experimental.MemoryAllocatorFunc(func(capacity, maximum uint64) experimental.LinearMemory {
		return &sliceMemory{}
	})
}
