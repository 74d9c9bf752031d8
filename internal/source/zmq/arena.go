package zmq

// minChunk is the smallest chunk an arena allocates, in elements.
const minChunk = 64

// arena hands out the slices of one decoded batch (its events' token ids, or
// their block hashes) from a few shared chunks instead of one allocation per
// event. The first chunk of a batch is sized by what the previous batch used,
// bounded by the bytes left in the payload (every element takes at least one
// byte of it), so a steady stream pays about one allocation per batch and a
// hostile hint cannot reserve more than its payload could fill. A batch never
// shares a chunk with another: it owns its slices, which may outlive the
// decoder's next batch (the actor holds BlockRemoved hashes; a replay cover
// holds whole batches).
type arena[T any] struct {
	buf  []T // the current chunk: buf[:len(buf)] is handed out
	used int // elements handed out in this batch
	hint int // elements the previous batch used
}

// newBatch starts a batch: later slices come from new chunks.
func (a *arena[T]) newBatch() {
	a.hint, a.used, a.buf = a.used, 0, nil
}

// take returns an empty slice with room for n elements; commit says how many
// were used. bound is the number of payload bytes left.
func (a *arena[T]) take(n, bound int) []T {
	if cap(a.buf)-len(a.buf) < n || a.buf == nil {
		a.buf = make([]T, 0, max(n, min(a.hint-a.used, bound), minChunk))
	}
	l := len(a.buf)
	return a.buf[l:l:min(l+n, cap(a.buf))]
}

// commit marks the first n elements of the last take as handed out.
func (a *arena[T]) commit(n int) {
	a.buf = a.buf[:len(a.buf)+n]
	a.used += n
}
