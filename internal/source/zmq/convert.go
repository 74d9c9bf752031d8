package zmq

import (
	"github.com/ckfrelay/ckfrelay/ckf"
)

// DropReason says why (part of) an engine event was not admitted on purpose.
type DropReason string

// Drop reasons.
const (
	DropNone        DropReason = ""
	DropBlockSize   DropReason = "block_size"   // the event's block size is not the configured one
	DropShortTokens DropReason = "short_tokens" // token_ids do not cover every block
	DropDuplicate   DropReason = "duplicate"    // a block hash repeats within the event (or equals its parent)
	DropRemote      DropReason = "remote"       // locality other than LOCAL
	DropUnknown     DropReason = "unknown_type" // an event type this relay does not know
)

// Converter turns engine events into the relay's [ckf.RouterEvent]s the way
// NVIDIA Dynamo's ZMQ converter does: the engine's block hash is the external
// block hash, tokens_hash is SPEC §3's local block hash of the block's token
// ids (salted with lora_name), worker from the configuration, dp rank from
// the batch.
type Converter struct {
	Worker    uint64
	BlockSize int
}

// Tier maps an engine medium to a storage tier as Dynamo does; absent or
// unknown media are the device tier.
func Tier(medium string) ckf.StorageTier {
	switch medium {
	case "CPU", "CPU_PINNED", "CPU_TIER1":
		return ckf.TierHostPinned
	case "CPU_TIER2", "DISK", "NVME", "STORAGE":
		return ckf.TierDisk
	case "EXTERNAL", "NETWORK", "REMOTE", "SHARED":
		return ckf.TierExternal
	}
	return ckf.TierDevice
}

// Convert returns the relay event of ev (ok false when nothing is left to
// admit), the number of blocks dropped and why.
func (c Converter) Convert(ev *Event, dpRank uint32, eventID uint64) (out ckf.RouterEvent, ok bool, dropped int, why DropReason) {
	out = ckf.RouterEvent{WorkerID: c.Worker, DPRank: dpRank, EventID: eventID, StorageTier: Tier(ev.Medium)}
	if ev.Locality != "" && ev.Locality != "LOCAL" {
		return ckf.RouterEvent{}, false, len(ev.BlockHashes), DropRemote
	}
	switch ev.Type {
	case BlockStored:
		out.Kind = ckf.EventStored
		out.HasParent, out.ParentHash = ev.HasParent, ev.ParentHash
		if hasDuplicate(ev) {
			return ckf.RouterEvent{}, false, len(ev.BlockHashes), DropDuplicate
		}
		if ev.BlockSize != c.BlockSize {
			return ckf.RouterEvent{}, false, len(ev.BlockHashes), DropBlockSize
		}
		salt := ckf.Salt(ev.LoRAName, "")
		n := min(len(ev.BlockHashes), len(ev.TokenIDs)/c.BlockSize)
		if n < len(ev.BlockHashes) {
			dropped, why = len(ev.BlockHashes)-n, DropShortTokens
		}
		if n == 0 {
			return ckf.RouterEvent{}, false, dropped, why
		}
		out.Blocks = make([]ckf.StoredBlock, n)
		for i := range n {
			toks := ev.TokenIDs[i*c.BlockSize : (i+1)*c.BlockSize]
			out.Blocks[i] = ckf.StoredBlock{BlockHash: ev.BlockHashes[i], TokensHash: ckf.LocalBlockHash(toks, salt)}
		}
		return out, true, dropped, why
	case BlockRemoved:
		out.Kind = ckf.EventRemoved
		out.BlockHashes = ev.BlockHashes
		return out, true, 0, DropNone
	case AllBlocksCleared:
		out.Kind = ckf.EventCleared
		return out, true, 0, DropNone
	}
	return ckf.RouterEvent{}, false, 0, DropUnknown
}

func hasDuplicate(ev *Event) bool {
	hs := ev.BlockHashes
	if len(hs) <= 16 {
		for i, h := range hs {
			if ev.HasParent && h == ev.ParentHash {
				return true
			}
			for _, g := range hs[:i] {
				if g == h {
					return true
				}
			}
		}
		return false
	}
	seen := make(map[uint64]struct{}, len(hs)+1)
	if ev.HasParent {
		seen[ev.ParentHash] = struct{}{}
	}
	for _, h := range hs {
		if _, dup := seen[h]; dup {
			return true
		}
		seen[h] = struct{}{}
	}
	return false
}
