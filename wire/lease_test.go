package wire

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// Every kind that names a lease gives it; a close frame and an unknown kind
// name none.
func TestFrame_Lease(t *testing.T) {
	l := ckf.LaneLease{ConsumerInstance: 7, PhysicalLane: 3, AssignmentEpoch: 9}
	for _, f := range []Frame{
		{Kind: KindSnapshotChunk, Snapshot: SnapshotChunk{Lease: l}},
		{Kind: KindDelta, Delta: ckf.Delta{Lease: l}},
		{Kind: KindHeartbeat, Heartbeat: Heartbeat{Lease: l}},
		{Kind: KindDrainMarker, Drain: ckf.DrainMarker{Lease: l}},
	} {
		got, ok := f.Lease()
		assert.True(t, ok, "%v", f.Kind)
		assert.Equal(t, l, got, "%v", f.Kind)
	}
	for _, f := range []Frame{{Kind: KindClose}, {Kind: Kind(99)}} {
		_, ok := f.Lease()
		assert.False(t, ok, "%v", f.Kind)
	}
}
