package abi

import (
	"encoding/binary"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
)

var le = binary.LittleEndian

// Result record layout (ResultSize bytes), written by last_result:
//
//	0  i32 code      status of the last apply (≥0: outcome, <0: error code)
//	4  u8  outcome   consumer.Outcome, 0 when the frame was rejected
//	5  u8  fault     consumer.Fault
//	6  i8  lane      lane the frame addressed, -1 for none
//	7  u8  kind      wire kind of the frame, 0 when it did not decode
//	8  u64 sequence  lane's installed sequence after the frame (0 when not ready)
//	16 u32 offset    byte offset of a decode error in the frame, 0 otherwise
//	20 u32 —         reserved, 0
//	24 u64 —         reserved, 0
type Result struct {
	Code     Code
	Result   consumer.Result
	Kind     uint8
	ErrorOff uint32
}

// PutResult writes r into b, which must be at least ResultSize bytes.
func PutResult(b []byte, r *Result) {
	clear(b[:ResultSize])
	le.PutUint32(b[0:], uint32(r.Code))
	b[4] = uint8(r.Result.Outcome)
	b[5] = uint8(r.Result.Fault)
	b[6] = uint8(int8(r.Result.Lane))
	b[7] = r.Kind
	le.PutUint64(b[8:], r.Result.Sequence)
	le.PutUint32(b[16:], r.ErrorOff)
}

// ReadResult decodes a record written by [PutResult].
func ReadResult(b []byte) Result {
	return Result{
		Code: Code(int32(le.Uint32(b[0:]))),
		Result: consumer.Result{
			Outcome:  consumer.Outcome(b[4]),
			Fault:    consumer.Fault(b[5]),
			Lane:     int(int8(b[6])),
			Sequence: le.Uint64(b[8:]),
		},
		Kind:     b[7],
		ErrorOff: le.Uint32(b[16:]),
	}
}

// Lane status record layout (LaneStatusSize bytes), written by lane_status.
// The producer identity is not repeated: its pool is the lane's pool (assign
// checks it) and its format the lane's (seed and bucket count at 152 and
// 160; the other format fields are version 1's constants), so a host
// rebuilds it from the record and the manifest it configured.
//
//	0   u8  configured         5  u8 last_outcome
//	1   u8  assigned           6  u8 last_fault
//	2   u8  ready              7  u8 lease.physical_lane
//	3   u8  has_epoch
//	4   u8  snapshot_in_progress
//	8   u64 lease.consumer_instance
//	16  u64 lease.assignment_epoch
//	24  u64 last_epoch
//	32  u64 installed_sequence
//	40  u32 chunks_staged      44 u32 chunk_count
//	48  u64 pool.dc_id
//	56  u64 identity.producer_incarnation
//	64  u64 identity.layout_generation
//	72  u64 × 9 stats: assignments, frames_applied, frames_ignored,
//	        deactivations, snapshot_retries, snapshots_installed,
//	        deltas_applied, images_applied, drains_acknowledged
//	144 i64 last_heartbeat_micros
//	152 u64 format.seed            the lane's format (consumer.LaneStatus.Format),
//	160 u64 format.bucket_count    0 and 0 when it has none yet
func PutLaneStatus(b []byte, s *consumer.LaneStatus) {
	clear(b[:LaneStatusSize])
	b[0] = b2u(s.Configured)
	b[1] = b2u(s.Assigned)
	b[2] = b2u(s.Ready)
	b[3] = b2u(s.HasEpoch)
	b[4] = b2u(s.SnapshotInProgress)
	b[5] = uint8(s.LastOutcome)
	b[6] = uint8(s.LastFault)
	b[7] = s.Lease.PhysicalLane
	le.PutUint64(b[8:], s.Lease.ConsumerInstance)
	le.PutUint64(b[16:], s.Lease.AssignmentEpoch)
	le.PutUint64(b[24:], s.LastEpoch)
	le.PutUint64(b[32:], s.InstalledSequence)
	le.PutUint32(b[40:], s.ChunksStaged)
	le.PutUint32(b[44:], s.ChunkCount)
	le.PutUint64(b[48:], s.Pool.DCID)
	le.PutUint64(b[56:], s.Identity.ProducerIncarnation)
	le.PutUint64(b[64:], s.Identity.LayoutGeneration)
	st := &s.Stats
	for i, v := range [...]uint64{st.Assignments, st.FramesApplied, st.FramesIgnored, st.Deactivations,
		st.SnapshotRetries, st.SnapshotsInstalled, st.DeltasApplied, st.ImagesApplied, st.DrainsAcknowledged} {
		le.PutUint64(b[72+8*i:], v)
	}
	le.PutUint64(b[144:], uint64(s.Stats.LastHeartbeatMicros))
	le.PutUint64(b[152:], s.Format.Seed)
	le.PutUint64(b[160:], s.Format.BucketCount)
}

// ReadLaneStatus decodes a record written by [PutLaneStatus] for lane i of a
// consumer configured with m, rebuilding the pool and identity from m.
func ReadLaneStatus(b []byte, m *consumer.Manifest, i int) consumer.LaneStatus {
	s := consumer.LaneStatus{
		Configured:         b[0] != 0,
		Assigned:           b[1] != 0,
		Ready:              b[2] != 0,
		HasEpoch:           b[3] != 0,
		SnapshotInProgress: b[4] != 0,
		LastOutcome:        consumer.Outcome(b[5]),
		LastFault:          consumer.Fault(b[6]),
		Lease: ckf.LaneLease{
			PhysicalLane:     b[7],
			ConsumerInstance: le.Uint64(b[8:]),
			AssignmentEpoch:  le.Uint64(b[16:]),
		},
		LastEpoch:         le.Uint64(b[24:]),
		InstalledSequence: le.Uint64(b[32:]),
		ChunksStaged:      le.Uint32(b[40:]),
		ChunkCount:        le.Uint32(b[44:]),
	}
	if s.Configured && i >= 0 && i < len(m.Lanes) && m.Lanes[i] != nil {
		s.Pool = *m.Lanes[i]
	}
	if n := le.Uint64(b[160:]); n != 0 {
		s.Format = ckf.NewFormat(le.Uint64(b[152:]), n)
	}
	if s.HasEpoch {
		s.Identity = ckf.ProducerIdentity{
			Pool:                s.Pool,
			ProducerIncarnation: le.Uint64(b[56:]),
			LayoutGeneration:    le.Uint64(b[64:]),
			Format:              s.Format,
		}
	}
	st := &s.Stats
	for i, p := range [...]*uint64{&st.Assignments, &st.FramesApplied, &st.FramesIgnored, &st.Deactivations,
		&st.SnapshotRetries, &st.SnapshotsInstalled, &st.DeltasApplied, &st.ImagesApplied, &st.DrainsAcknowledged} {
		*p = le.Uint64(b[72+8*i:])
	}
	st.LastHeartbeatMicros = int64(le.Uint64(b[144:]))
	return s
}

// Stats record layout (StatsSize bytes), written by stats:
//
//	0  u64 bucket_count   the one format group's, or the largest of several
//	8  u64 table_bytes    every group's table together
//	16 u16 ready_mask, then 6 bytes of 0
//	24 u64 queries
//	32 u64 probes
//	40 u32 groups         format groups (0 before the first assignment of a
//	                      consumer with no format pinned to every lane)
//	44 —   reserved (4 bytes of 0)
func PutStats(b []byte, s *consumer.Stats) {
	clear(b[:StatsSize])
	le.PutUint64(b[0:], s.BucketCount)
	le.PutUint64(b[8:], s.TableBytes)
	le.PutUint16(b[16:], s.ReadyMask)
	le.PutUint64(b[24:], s.Queries)
	le.PutUint64(b[32:], s.Probes)
	le.PutUint32(b[40:], uint32(s.Groups))
}

// ReadStats decodes a record written by [PutStats].
func ReadStats(b []byte) consumer.Stats {
	return consumer.Stats{
		BucketCount: le.Uint64(b[0:]),
		TableBytes:  le.Uint64(b[8:]),
		ReadyMask:   le.Uint16(b[16:]),
		Queries:     le.Uint64(b[24:]),
		Probes:      le.Uint64(b[32:]),
		Groups:      int(le.Uint32(b[40:])),
	}
}

func b2u(v bool) uint8 {
	if v {
		return 1
	}
	return 0
}

// Query record layout (QueryRecordSize bytes), written by query:
//
//	0  u32 × 16 depths    depth of lane l at 4*l; 0 for lanes not in mask
//	64 u32 mask           ready mask captured when the query started
//	68 u32 blocks         number of blocks queried
//	72 u32 probes         table probes made
//	76 —   reserved, 0
func PutQueryRecord(b []byte, r *consumer.QueryResult) {
	clear(b[:QueryRecordSize])
	for i, d := range r.Depths {
		le.PutUint32(b[4*i:], d)
	}
	le.PutUint32(b[64:], uint32(r.Mask))
	le.PutUint32(b[68:], uint32(r.Blocks))
	le.PutUint32(b[72:], uint32(r.Probes))
}

// ReadQueryRecord decodes a record written by [PutQueryRecord].
func ReadQueryRecord(b []byte, r *consumer.QueryResult) {
	for i := range r.Depths {
		r.Depths[i] = le.Uint32(b[4*i:])
	}
	r.Mask = uint16(le.Uint32(b[64:]))
	r.Blocks = int(le.Uint32(b[68:]))
	r.Probes = int(le.Uint32(b[72:]))
}
