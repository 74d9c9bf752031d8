package hub

// Position is where the mirror stands: the assignment epoch of the lease its
// snapshot came under, the sequence it reached on that lease's stream, and
// whether it is ready (installed, unbroken) or closed.
type Position struct {
	Epoch    uint64
	Sequence uint64
	Ready    bool
	Closed   bool
}

// Covers reports whether a mirror at p carries everything the publisher had
// published by the time its lease was epoch and its last sequence seq: the
// same lease's stream up to seq at least, or a later lease, whose snapshot
// was taken after. The hub is the publisher's only subscriber, so a later
// epoch is a later barrier snapshot.
func (p Position) Covers(epoch, seq uint64) bool {
	return p.Ready && (p.Epoch > epoch || p.Epoch == epoch && p.Sequence >= seq)
}

// Watch returns the mirror's position and a channel closed at its next
// change (a delta, a new snapshot, the close). Call it again after each wake.
func (h *Hub) Watch() (Position, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return Position{Epoch: h.epoch, Sequence: h.sequence, Ready: h.ready, Closed: h.closed}, h.wake
}
