package ckf

import "fmt"

// StorageTier is where a worker holds a block. Only [TierDevice] blocks are
// routed on; the zero value is TierDevice (Dynamo's default).
type StorageTier uint8

// Storage tiers.
const (
	TierDevice StorageTier = iota
	TierHostPinned
	TierDisk
	TierExternal
)

var tierNames = [...]string{"device", "host_pinned", "disk", "external"}

func (t StorageTier) String() string {
	if int(t) < len(tierNames) {
		return tierNames[t]
	}
	return fmt.Sprintf("StorageTier(%d)", t)
}

// ParseStorageTier parses Dynamo's tier names.
func ParseStorageTier(s string) (StorageTier, bool) {
	for i, n := range tierNames {
		if n == s {
			return StorageTier(i), true
		}
	}
	return 0, false
}

// Member is one worker rank: (worker_id, dp_rank). Members are ordered by
// worker id, then rank.
type Member struct {
	WorkerID uint64
	DPRank   uint32
}

// Compare orders members by (WorkerID, DPRank).
func (m Member) Compare(o Member) int {
	switch {
	case m.WorkerID < o.WorkerID:
		return -1
	case m.WorkerID > o.WorkerID:
		return 1
	case m.DPRank < o.DPRank:
		return -1
	case m.DPRank > o.DPRank:
		return 1
	}
	return 0
}

// EventKind says which data an event carries.
type EventKind uint8

// Event kinds.
const (
	EventStored EventKind = iota + 1
	EventRemoved
	EventCleared
)

func (k EventKind) String() string {
	switch k {
	case EventStored:
		return "stored"
	case EventRemoved:
		return "removed"
	case EventCleared:
		return "cleared"
	}
	return fmt.Sprintf("EventKind(%d)", k)
}

// StoredBlock is one block of a Stored event: the engine's external block hash
// (an opaque per-source id) and the local hash of its tokens.
type StoredBlock struct {
	BlockHash  uint64
	TokensHash uint64
}

// RouterEvent is one KV-cache event in Dynamo's RouterEvent shape:
// {worker_id, storage_tier, event{event_id, dp_rank, data}}. Kind selects the
// data: Stored uses Parent/HasParent, StartPosition/HasStartPosition and
// Blocks; Removed uses BlockHashes; Cleared uses none. Slices are borrowed by
// [Pool.ApplyEvent] only for the duration of the call.
type RouterEvent struct {
	WorkerID    uint64
	StorageTier StorageTier
	EventID     uint64
	DPRank      uint32
	Kind        EventKind

	HasParent        bool
	ParentHash       uint64
	HasStartPosition bool
	StartPosition    uint32
	Blocks           []StoredBlock

	BlockHashes []uint64
}

// Member returns the event's (worker_id, dp_rank).
func (e *RouterEvent) Member() Member { return Member{WorkerID: e.WorkerID, DPRank: e.DPRank} }

// BlockCount returns the number of blocks the event names (min 1), the weight
// the producer charges against its payload permits.
func (e *RouterEvent) BlockCount() int {
	return max(1, len(e.Blocks), len(e.BlockHashes))
}
