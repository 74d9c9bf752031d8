package host

// sliceMemory is a LinearMemory on the Go heap that copies on growth (what
// wazero does by default); the fallback when a reservation fails.
type sliceMemory struct{ buf []byte }

func (m *sliceMemory) Reallocate(size uint64) []byte {
	if size <= uint64(cap(m.buf)) {
		m.buf = m.buf[:size]
		return m.buf[:size:size]
	}
	nb := make([]byte, size, max(size, 2*uint64(cap(m.buf))))
	copy(nb, m.buf)
	m.buf = nb
	return nb[:size:size]
}

func (m *sliceMemory) Free() { m.buf = nil }
