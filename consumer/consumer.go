package consumer

import (
	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire"
)

// lanes is the fixed lane count of the transposed table (the row width).
const lanes = ckf.MaxLanes

// Consumer holds up to 16 pools' filters and answers prefix-depth queries
// over the lanes that are ready (SPEC §8).
//
// Each lane's format (seed, bucket count) comes from its assignment, so
// pools of different sizes share one consumer. Lanes of the same format form
// a format group ([group]) with one bucket-major, lane-minor table whose rows
// are the group's lane count rounded up to 1, 2, 4, 8 or 16 words; one
// logical probe is the OR of each group's two-row probe, mapped into the
// lane mask, so the prefix search is the same for any mix (docs/RATIONALE.md,
// "Why format groups with narrow rows?").
//
// Lanes of one format are the table of before: one group of 16-word rows
// where the word of bucket b in lane l is at index b*16+l, so one probe
// reads the same two rows for all 16 lanes (2 × 128 bytes), bucket_count ×
// 128 bytes (64 MiB at 524,288 buckets) whatever the number of lanes, and
// queries run the same code and kernel as before. A version-1 manifest
// (one format pinned to every lane) allocates it in New; otherwise groups
// are built, and rebuilt narrow or 16 wide, as lanes are assigned.
//
// A Consumer is not safe for concurrent use: frames and queries must be
// serialized by the caller (the WebAssembly guest is single-threaded). It
// starts no goroutine and touches no OS resource. The zero value is not
// usable; build one with [New].
type Consumer struct {
	manifest Manifest
	window   int

	// groups are the format groups, sorted by seed.
	groups []*group
	// uniform: one group of 16 slots where slot l is lane l; then words,
	// addresser and bucketCount are that group's and queries take the
	// one-table path (and, in WebAssembly, the search kernel).
	uniform     bool
	words       []uint64
	addresser   ckf.Addresser
	bucketCount uint64

	// ready has bit l set when lane l is ready. Queries read it once.
	// INVARIANT: bit l is set iff lanes[l].ready.
	ready uint16
	lanes [lanes]lane

	// seen is a bitset over buckets (of the largest group) used to reject
	// duplicate images before any write; every bit is zero between calls.
	seen []uint64

	q querier

	// frame is reused by ApplyFrameBytes.
	frame wire.Frame
}

// lane is the state machine of one physical lane (SPEC §8.3).
type lane struct {
	configured bool
	pool       ckf.PoolID
	// pin is the format the manifest requires of the lane (zero: any).
	pin ckf.Format

	assigned bool
	identity ckf.ProducerIdentity
	lease    ckf.LaneLease // current lease, or the last one once revoked

	// grp and slot place the lane's column: the group of its current
	// format (nil before its first assignment) and its slot in the rows.
	grp  *group
	slot int

	hasEpoch  bool
	lastEpoch uint64

	ready     bool
	installed uint64

	// Partial chunked snapshot, staged in the lane's own column of the table
	// (invisible while the lane is not ready; see docs/RATIONALE.md).
	staging      bool
	stageSeq     uint64
	stageNext    uint32 // index of the next expected chunk
	stageCount   uint32
	stageCovered uint64 // buckets written so far

	lastOutcome Outcome
	lastFault   Fault
	stats       LaneStats
}

// New validates m and returns a Consumer with every lane unassigned. A
// manifest with one format for every lane (Format set, no lane pin that
// differs) allocates the whole 16-lane table up front; otherwise each group
// is allocated when its first lane is assigned.
func New(m Manifest) (*Consumer, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	c := &Consumer{manifest: m, window: m.VerificationWindow}
	for i, p := range m.Lanes {
		if p != nil {
			c.lanes[i].configured = true
			c.lanes[i].pool = *p
			c.lanes[i].pin = m.LaneFormat(i)
		}
	}
	if f, ok := m.UniformFormat(); ok {
		g := newGroup(f, lanes)
		g.fixed = true
		for i := range c.lanes {
			if c.lanes[i].configured {
				g.slotLane[i] = int8(i)
				g.members |= 1 << i
				c.lanes[i].grp, c.lanes[i].slot = g, i
			}
		}
		g.remap()
		c.groups = []*group{g}
		c.seen = make([]uint64, (f.BucketCount+63)/64)
		c.regroup()
	}
	return c, nil
}

// Manifest returns the manifest the consumer was built from.
func (c *Consumer) Manifest() Manifest { return c.manifest }

// ReadyMask returns the lanes that queries currently answer for (bit l = lane l).
func (c *Consumer) ReadyMask() uint16 { return c.ready }

func (c *Consumer) laneIndex(op string, i int) (*lane, error) {
	if i < 0 || i >= lanes || !c.lanes[i].configured {
		return nil, &LaneError{Op: op, Lane: i, Err: ErrWrongLane}
	}
	return &c.lanes[i], nil
}

// Assign grants lease.PhysicalLane to the producer identity (SPEC §8.3). It
// checks, in order: the consumer instance, the lane, the identity's pool
// against the lane's pool, the identity's format (valid, and the lane's pin
// when the manifest pins one), and that the epoch is greater than every
// epoch ever assigned to the lane (retire keeps it). A failure is a
// [*LaneError] and leaves the lane untouched. On success readiness is
// cleared first, any partial snapshot is discarded, and the lane waits for a
// snapshot under the new lease at installed sequence 0.
//
// The lane's format is the identity's. A lane whose format changes (a
// resubscribe to a resized pool) leaves its group — dropped when it empties
// — and joins the group of its new format, created or widened as needed;
// its column there is only read once a snapshot has rewritten all of it.
func (c *Consumer) Assign(identity ckf.ProducerIdentity, lease ckf.LaneLease) error {
	li := int(lease.PhysicalLane)
	if lease.ConsumerInstance != c.manifest.ConsumerInstance {
		return &LaneError{Op: "assign", Lane: li, Err: ErrWrongConsumer}
	}
	l, err := c.laneIndex("assign", li)
	if err != nil {
		return err
	}
	switch {
	case identity.Pool != l.pool:
		return &LaneError{Op: "assign", Lane: li, Err: ErrWrongPool}
	case l.pin != (ckf.Format{}) && identity.Format != l.pin:
		return &LaneError{Op: "assign", Lane: li, Err: ErrFormatMismatch}
	case identity.Format.Validate() != nil:
		return &LaneError{Op: "assign", Lane: li, Err: ErrFormatMismatch}
	case l.hasEpoch && lease.AssignmentEpoch <= l.lastEpoch:
		return &LaneError{Op: "assign", Lane: li, Err: ErrStaleAssignmentEpoch}
	}
	c.setReady(li, false)
	c.join(li, identity.Format)
	l.staging = false
	l.assigned = true
	l.identity = identity
	l.lease = lease
	l.hasEpoch = true
	l.lastEpoch = lease.AssignmentEpoch
	l.installed = 0
	l.stats.Assignments++
	return nil
}

// Retire takes lane i out of service: not ready, no assignment, any partial
// snapshot discarded. The last assigned epoch is kept, so a later [Assign]
// must use a greater one. Its words stay in the table but are invisible.
func (c *Consumer) Retire(i int) error {
	l, err := c.laneIndex("retire", i)
	if err != nil {
		return err
	}
	c.setReady(i, false)
	l.staging = false
	l.assigned = false
	l.installed = 0
	return nil
}

func (c *Consumer) setReady(i int, ready bool) {
	c.lanes[i].ready = ready
	if ready {
		c.ready |= 1 << i
	} else {
		c.ready &^= 1 << i
	}
}

// LaneStats counts what one lane's frames did over the consumer's lifetime.
type LaneStats struct {
	Assignments         uint64 // successful Assign calls
	FramesApplied       uint64 // frames that changed the lane (applied, installed, chunk staged, drain acknowledged, heartbeat)
	FramesIgnored       uint64 // IgnoredForeignLease, IgnoredStaleOrDuplicate, AwaitingSnapshot
	Deactivations       uint64 // Deactivated outcomes
	SnapshotRetries     uint64 // RetrySnapshot outcomes
	SnapshotsInstalled  uint64
	DeltasApplied       uint64
	ImagesApplied       uint64
	DrainsAcknowledged  uint64
	LastHeartbeatMicros int64 // unix µs of the last heartbeat under a current lease, 0 if none
}

// LaneStatus is a snapshot of one lane's state, for hosts and diagnostics.
type LaneStatus struct {
	Configured bool
	Pool       ckf.PoolID
	// Assigned is true while a lease is current; Lease and Identity then
	// describe it. After a retire or deactivation they keep the last values.
	Assigned bool
	Lease    ckf.LaneLease
	Identity ckf.ProducerIdentity
	// Format is the lane's format: its last assignment's (Identity.Format),
	// else the manifest's pin for it, else zero. Its words (AppendLaneWords)
	// are Format.BucketCount long.
	Format ckf.Format
	// LastEpoch is the greatest epoch ever assigned (valid when HasEpoch).
	HasEpoch  bool
	LastEpoch uint64
	Ready     bool
	// InstalledSequence is the sequence the lane's words are at (0 when not ready).
	InstalledSequence uint64
	// SnapshotInProgress is true while chunks of a snapshot are staged;
	// ChunksStaged of ChunkCount have arrived.
	SnapshotInProgress bool
	ChunksStaged       uint32
	ChunkCount         uint32
	LastOutcome        Outcome
	LastFault          Fault
	Stats              LaneStats
}

// LaneStatus returns the state of lane i. An unconfigured lane is reported
// with Configured false and no error; an index outside 0..15 is a [*LaneError].
func (c *Consumer) LaneStatus(i int) (LaneStatus, error) {
	if i < 0 || i >= lanes {
		return LaneStatus{}, &LaneError{Op: "status", Lane: i, Err: ErrWrongLane}
	}
	l := &c.lanes[i]
	s := LaneStatus{
		Configured:  l.configured,
		Pool:        l.pool,
		Assigned:    l.assigned,
		Lease:       l.lease,
		Identity:    l.identity,
		Format:      l.pin,
		HasEpoch:    l.hasEpoch,
		LastEpoch:   l.lastEpoch,
		Ready:       l.ready,
		LastOutcome: l.lastOutcome,
		LastFault:   l.lastFault,
		Stats:       l.stats,
	}
	if l.hasEpoch {
		s.Format = l.identity.Format
	}
	if l.ready {
		s.InstalledSequence = l.installed
	}
	if l.staging {
		s.SnapshotInProgress = true
		s.ChunksStaged = l.stageNext
		s.ChunkCount = l.stageCount
	}
	return s, nil
}

// AppendLaneWords appends lane i's column of the table (bucket_count words,
// bucket order) to dst and returns it. Only a ready lane has words to give:
// the column of a lane that is not ready may be stale or half staged, so it
// is a [*LaneError] matching [ErrUnavailable] and dst comes back unchanged.
// It is meant for diagnostics and for comparing a lane with its producer's
// table. Cost: O(bucket_count) strided reads.
func (c *Consumer) AppendLaneWords(dst []uint64, i int) ([]uint64, error) {
	if i < 0 || i >= lanes {
		return dst, &LaneError{Op: "words", Lane: i, Err: ErrWrongLane}
	}
	l := &c.lanes[i]
	if !l.ready {
		return dst, &LaneError{Op: "words", Lane: i, Err: ErrUnavailable}
	}
	g, w := l.grp, uint64(l.grp.width)
	for b := range g.bucketCount {
		dst = append(dst, g.words[b*w+uint64(l.slot)])
	}
	return dst, nil
}

// Stats is the consumer-wide view.
type Stats struct {
	// BucketCount is the bucket count of the one format group, or the
	// largest of several (0 before any group exists).
	BucketCount uint64
	TableBytes  uint64 // bytes of every group's table together
	Groups      int    // format groups
	ReadyMask   uint16
	Queries     uint64 // queries answered (including Contains)
	Probes      uint64 // row-pair probes made by queries
}

// Stats returns the consumer-wide counters.
func (c *Consumer) Stats() Stats {
	s := Stats{Groups: len(c.groups)}
	for _, g := range c.groups {
		s.BucketCount = max(s.BucketCount, g.bucketCount)
		s.TableBytes += uint64(len(g.words)) * 8
	}
	s.ReadyMask, s.Queries, s.Probes = c.ready, c.q.queries, c.q.probes
	return s
}
