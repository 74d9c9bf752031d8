package e2e

// A hostile stream beside the pools: a relay (or whatever sits between)
// that serves one lane of the router honestly and speaks for the others on
// it, under their current leases and identities, as a relay that saw their
// stream URLs would. Every such frame must end the hostile session with
// client.ErrProtocol and leave the victim lane exactly as it was.

import (
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wire"
)

// consumerLanes is the rig's consumer as client.Lanes, for the router's
// session gate; the rig keeps the *consumer.Consumer itself for the
// consumer-only reads of its checks (ReadyMask, the linear query).
type consumerLanes struct{ *consumer.Consumer }

func (c consumerLanes) ApplyFrame(b []byte) (consumer.Result, error) { return c.ApplyFrameBytes(b) }
func (c consumerLanes) Stats() (consumer.Stats, error)               { return c.Consumer.Stats(), nil }

var _ client.Lanes = consumerLanes{}

// hostile is the hostile stream's own lane and session.
type hostile struct {
	r     *rig
	lane  int
	id    ckf.ProducerIdentity
	lease ckf.LaneLease
	sess  *client.Session
}

// newHostile takes the lowest lane no pool uses and gives it a pool of its
// own in m.
func newHostile(r *rig, m *consumer.Manifest) *hostile {
	lane := 0
	for r.laneMask&(1<<lane) != 0 {
		lane++
	}
	pool := ckf.PoolID{Domain: testDomain, DCID: 999}
	m.Lanes[lane] = &pool
	return &hostile{r: r, lane: lane, id: ckf.ProducerIdentity{Pool: pool, ProducerIncarnation: 1, Format: r.format},
		lease: ckf.LaneLease{ConsumerInstance: consumerInstance, PhysicalLane: uint8(lane)}}
}

func (r *rig) hostileMask() uint16 {
	if r.hostile == nil {
		return 0
	}
	return 1 << r.hostile.lane
}

// resubscribe starts a new hostile session under the next epoch and installs
// its (honest) snapshot, as a router does after the session ended.
func (h *hostile) resubscribe() {
	t := h.r.t
	t.Helper()
	h.lease.AssignmentEpoch++
	h.sess = client.NewSession(h.r.lanes, h.lease)
	f := wire.Frame{Kind: wire.KindSnapshotChunk, Snapshot: wire.SnapshotChunk{Identity: h.id, Lease: h.lease, Sequence: 1,
		ChunkCount: 1, Words: make([]uint64, h.r.format.BucketCount)}}
	raw, err := wire.AppendFrame(nil, &f)
	require.NoError(t, err, "hostile snapshot")
	res, err := h.sess.Apply(raw)
	require.NoError(t, err, "hostile snapshot")
	require.Equal(t, consumer.SnapshotInstalled, res.Outcome, "hostile snapshot: %v", res)
}

// attack sends, on the hostile session, a frame of kind k (0 delta, 1
// heartbeat, 2 drain marker, 3 snapshot chunk) under p's current lease and
// identity, placed where it would hurt most: right after the lane's
// installed sequence, with word in its images. The session must refuse it
// and nothing of p's lane may change; then the hostile lane resubscribes.
func (h *hostile) attack(p *pool, k int, word uint64) {
	t := h.r.t
	t.Helper()
	before := p.laneStatus()
	inst := before.InstalledSequence
	id := p.h.Identity()
	var f wire.Frame
	switch k {
	case 0:
		f = wire.Frame{Kind: wire.KindDelta, Delta: ckf.Delta{Identity: id, Lease: p.lease, BaseSequence: inst, Sequence: inst + 1,
			Images: []ckf.BucketImage{{Bucket: uint32(word % h.r.format.BucketCount), Word: word}}}}
	case 1:
		f = wire.Frame{Kind: wire.KindHeartbeat, Heartbeat: wire.Heartbeat{Identity: id, Lease: p.lease, LastSequence: inst + 5}}
	case 2:
		f = wire.Frame{Kind: wire.KindDrainMarker, Drain: ckf.DrainMarker{Lease: p.lease, ExpectedSequence: inst + 7}}
	default:
		words := make([]uint64, h.r.format.BucketCount)
		for i := range words {
			words[i] = word
		}
		f = wire.Frame{Kind: wire.KindSnapshotChunk, Snapshot: wire.SnapshotChunk{Identity: id, Lease: p.lease, Sequence: inst + 1,
			ChunkCount: 1, Words: words}}
	}
	raw, err := wire.AppendFrame(nil, &f)
	require.NoError(t, err, "hostile %v", f.Kind)
	res, err := h.sess.Apply(raw)
	require.Equal(t, before, p.laneStatus(), "pool %d lane %d changed by a hostile %v on lane %d", p.idx, p.lane, f.Kind, h.lane)
	require.ErrorIs(t, err, client.ErrProtocol, "hostile %v under pool %d's lease: %v", f.Kind, p.idx, res)
	require.Equal(t, -1, res.Lane, "hostile %v: applied to a lane", f.Kind)
	h.r.hostileFrames++
	h.resubscribe()
}
