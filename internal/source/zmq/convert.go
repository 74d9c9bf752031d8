package zmq

import (
	"math"
	"slices"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// DropReason says why (part of) an engine event was not admitted on purpose.
// It is the "reason" label of ckfrelay_source_dropped_reason_total and a key
// of the catalog's dropped_by_reason.
type DropReason string

// Drop reasons. The group and namespace ones carry Dynamo's labels
// (lib/kv-router/src/zmq_wire/mod.rs, ZmqEventFilterReason).
const (
	DropNone        DropReason = ""
	DropBlockSize   DropReason = "block_size"   // the event's block size is not the configured one
	DropShortTokens DropReason = "short_tokens" // token_ids do not cover every block
	DropDuplicate   DropReason = "duplicate"    // a block hash repeats within the event (or equals its parent)
	DropRemote      DropReason = "remote"       // locality other than LOCAL (REMOTE or unknown)
	// DropOwnership: ownership "kvcr" (a KV connector's transition, which
	// Dynamo's normalizer does not index); DropUnknownOwnership: any other
	// ownership value (Dynamo's labels, zmq_wire/mod.rs).
	DropOwnership        DropReason = "unsupported_ownership"
	DropUnknownOwnership DropReason = "unknown_ownership"
	DropUnknown          DropReason = "unknown_type" // an event type this relay does not know
	DropMedium           DropReason = "unknown_medium"
	// DropStringTokens: token_ids holding strings (TensorRT-LLM's
	// EventTokenId = int | str), whose block keys cannot be computed.
	DropStringTokens DropReason = "string_token_ids"
	DropKind         DropReason = "non_main_attention_kind"   // kv_cache_spec_kind not a full-attention kind
	DropUnknownKind  DropReason = "unknown_kind"              // a kv_cache_spec_kind this relay does not know
	DropGroup        DropReason = "non_main_attention_group"  // the group was learned as a non-main kind
	DropUnlearned    DropReason = "unlearned_group_idx"       // a non-zero group whose kind was never seen
	DropAmbiguous    DropReason = "ambiguous_cache_namespace" // the parent was seen under two namespaces
	DropNSLimit      DropReason = "namespace_limit"           // the namespace table is full
	DropParentLost   DropReason = "parent_lost"               // degraded rank: the parent was not heard since the reset
	// DropHashFormat: a BlockStored of the other hash format than the
	// pool's (bigram Eagle token_ids into a dynamo_standard_v1 pool, flat
	// token_ids into a dynamo_eagle_v1 one), whose keys no router of the
	// pool would compute.
	DropHashFormat DropReason = "hash_format"
)

// DefaultMaxNamespaceBlocks bounds a source's namespace table (block hashes
// with a known namespace, over all its ranks).
const DefaultMaxNamespaceBlocks = 1 << 20

// maxGroups bounds the learned (dp rank, group) kinds of a source; past it a
// new group is not learned (and, if non-zero, its events are dropped).
const maxGroups = 4096

// Converter turns engine events into the relay's [ckf.RouterEvent]s the way
// NVIDIA Dynamo's ZMQ normalizer does (docs/ingest.md, "Conversion"): it
// drops events of another ownership, non-local and unknown-medium events
// before it learns anything from them, filters cache groups, propagates
// cache namespaces down each rank's parent chain (device and host tiers
// only), and hashes every block (tokens_hash: SPEC §3's local block hash,
// seeded with ckf.Salt(lora_name, namespace), multimodal hashes appended or
// placeholder runs replaced by pad values, Eagle windows). It keeps
// per-rank state (group kinds, namespaces); the zero value beyond Worker and
// BlockSize is ready to use. Not safe for concurrent use.
type Converter struct {
	Worker    uint64
	BlockSize int
	// Eagle is the pool's hash format: Eagle windows (block_size+1 tokens
	// at a block_size stride, Dynamo's DYNAMO_EAGLE_V1) for bigram events;
	// the events of the other format are dropped (DropHashFormat).
	Eagle bool
	// ImageTokenID, when HasImageToken, is the model's image placeholder: a
	// block with multimodal hashes whose tokens hold it is hashed with each
	// run of it replaced by ckf.PadValue(mm_hash) and without its mm hashes
	// (Dynamo's image_token_id normalisation).
	ImageTokenID  uint32
	HasImageToken bool
	// VideoTokenID, when HasVideoToken, is the model's video placeholder:
	// every block with multimodal hashes is then normalised only when its
	// image and video runs map onto its mm hashes exactly (a run of video
	// runs is one object), else hashed with its mm hashes (Dynamo's
	// video_token_id normalisation, normalize_mm_placeholder_runs).
	VideoTokenID  uint32
	HasVideoToken bool
	// MaxNamespaceBlocks bounds the namespace table (default
	// DefaultMaxNamespaceBlocks).
	MaxNamespaceBlocks int

	groups map[groupKey]string           // learned kv_cache_spec_kind
	ns     map[uint32]map[uint64]nsEntry // per dp rank: block hash → namespace
	nsLen  int
	// blocks: the converted events' block slices, cut from a chunk per
	// batch ([Converter.beginBatch]) instead of one allocation per event.
	blocks arena[ckf.StoredBlock]
}

// beginBatch tells the converter that the next events are one batch of at
// most n stored blocks: their block slices share one allocation, which the
// batch's events then own together (the actor takes the batch's events and
// drops them together).
func (c *Converter) beginBatch(n int) {
	c.blocks.newBatch()
	c.blocks.hint = n
}

type groupKey struct{ dp, group uint32 }

// nsEntry is a block's namespace, or ambiguous (seen under two), and the
// tiers that hold it (a bit per ckf.StorageTier; 0: none recorded).
type nsEntry struct {
	ns        string
	ambiguous bool
	tiers     uint8
}

// Tier maps an engine medium to a storage tier as Dynamo does; ok is false
// for an unknown medium (dropped: fail closed). An absent or empty medium is
// the device tier.
func Tier(medium string) (tier ckf.StorageTier, ok bool) {
	switch medium {
	case "", "GPU", "DEVICE":
		return ckf.TierDevice, true
	case "CPU", "CPU_PINNED", "CPU_TIER1":
		return ckf.TierHostPinned, true
	case "CPU_TIER2", "DISK", "NVME", "STORAGE":
		return ckf.TierDisk, true
	case "EXTERNAL", "NETWORK", "REMOTE", "SHARED":
		return ckf.TierExternal, true
	}
	return ckf.TierDevice, false
}

// mainKinds are the kv_cache_spec_kinds indexed (prompt-prefix attention);
// otherKinds the known kinds that are not.
var (
	mainKinds  = []string{"full_attention", "mla_attention", "sink_full_attention"}
	otherKinds = []string{"sliding_window", "sliding_window_mla", "mamba", "chunked_local_attention",
		"encoder_only_attention", "cross_attention"}
)

func kindReason(kind string, learned bool) DropReason {
	for _, k := range mainKinds {
		if k == kind {
			return DropNone
		}
	}
	for _, k := range otherKinds {
		if k == kind {
			if learned {
				return DropGroup
			}
			return DropKind
		}
	}
	return DropUnknownKind
}

// groupFilter learns a BlockStored's group kind and says whether ev's group
// is indexed (Dynamo zmq_wire/mod.rs filter_reason).
func (c *Converter) groupFilter(ev *Event, dp uint32) DropReason {
	if ev.Type != BlockStored && ev.Type != BlockRemoved {
		return DropNone
	}
	if ev.Type == BlockStored && ev.HasGroup && ev.Kind != "" {
		if c.groups == nil {
			c.groups = map[groupKey]string{}
		}
		k := groupKey{dp, ev.GroupIdx}
		// A lookup first: the kind rarely changes, and a map write per
		// event costs more than a read.
		if old, ok := c.groups[k]; (ok && old != ev.Kind) || (!ok && len(c.groups) < maxGroups) {
			c.groups[k] = ev.Kind
		}
	}
	if ev.Kind != "" {
		return kindReason(ev.Kind, false)
	}
	if !ev.HasGroup {
		return DropNone
	}
	if kind, ok := c.groups[groupKey{dp, ev.GroupIdx}]; ok {
		return kindReason(kind, true)
	}
	if ev.GroupIdx == 0 {
		return DropNone
	}
	return DropUnlearned
}

// namespace propagates cache namespaces per dp rank (Dynamo zmq_wire/mod.rs
// propagate_cache_namespace) and returns the namespace a BlockStored is
// hashed under.
func (c *Converter) namespace(ev *Event, dp uint32, tier ckf.StorageTier) (string, DropReason) {
	switch ev.Type {
	case BlockStored:
		ns := ev.Namespace
		tab := c.ns[dp]
		if ns == "" && ev.HasParent {
			if e, ok := tab[ev.ParentHash]; ok {
				if e.ambiguous {
					return "", DropAmbiguous
				}
				ns = e.ns
			}
		}
		if ns == "" {
			// Unsalted blocks are not kept, but a hash already held under a
			// namespace becomes ambiguous.
			for _, h := range ev.BlockHashes {
				if e, ok := tab[h]; ok {
					tab[h] = nsEntry{ambiguous: true, tiers: e.tiers | 1<<tier}
				}
			}
			return "", DropNone
		}
		max := c.MaxNamespaceBlocks
		if max <= 0 {
			max = DefaultMaxNamespaceBlocks
		}
		if c.nsLen+len(ev.BlockHashes) > max {
			return "", DropNSLimit
		}
		if tab == nil {
			if c.ns == nil {
				c.ns = map[uint32]map[uint64]nsEntry{}
			}
			tab = map[uint64]nsEntry{}
			c.ns[dp] = tab
		}
		for _, h := range ev.BlockHashes {
			e, ok := tab[h]
			switch {
			case !ok:
				e = nsEntry{ns: ns}
				c.nsLen++
			case e.ambiguous || e.ns != ns:
				e = nsEntry{ambiguous: true, tiers: e.tiers}
			}
			e.tiers |= 1 << tier
			tab[h] = e
		}
		return ns, DropNone
	case BlockRemoved:
		// A block still held on another tier keeps its namespace (Dynamo's
		// cache_namespace_tiers); the last tier's removal forgets it, unless
		// it is ambiguous.
		tab := c.ns[dp]
		for _, h := range ev.BlockHashes {
			e, ok := tab[h]
			if !ok {
				continue
			}
			if e.tiers != 0 {
				e.tiers &^= 1 << tier
				tab[h] = e
				if e.tiers != 0 {
					continue
				}
			}
			if !e.ambiguous {
				delete(tab, h)
				c.nsLen--
			}
		}
	case AllBlocksCleared:
		c.ForgetRank(dp)
	}
	return "", DropNone
}

// ForgetRank drops the namespace table of dp (its blocks are gone: a clear,
// or a reset of the rank).
func (c *Converter) ForgetRank(dp uint32) {
	c.nsLen -= len(c.ns[dp])
	delete(c.ns, dp)
}

// NamespaceBlocks returns the size of the namespace table.
func (c *Converter) NamespaceBlocks() int { return c.nsLen }

// Convert returns the relay event of ev (ok false when nothing is left to
// admit), the number of blocks dropped and why. The gates run in the order
// of Dynamo's normalizer (zmq_wire/mod.rs preprocess_with_reason, then
// convert.rs convert_event): ownership; locality; medium, where the disk and
// external tiers skip the group filter and the namespace chain (they carry
// no cache metadata and must not change it); then the group filter (which
// learns a BlockStored's kind) and the namespace chain; then the per-event
// checks of conversion. A dropped event teaches nothing to a later gate.
func (c *Converter) Convert(ev *Event, dpRank uint32, eventID uint64) (out ckf.RouterEvent, ok bool, dropped int, why DropReason) {
	if ev.Type == Unknown {
		return ckf.RouterEvent{}, false, 0, DropUnknown
	}
	if ev.HasOwnership {
		if ev.Ownership == "kvcr" {
			return ckf.RouterEvent{}, false, whole(ev), DropOwnership
		}
		return ckf.RouterEvent{}, false, whole(ev), DropUnknownOwnership
	}
	if ev.Locality != "" && ev.Locality != "LOCAL" {
		return ckf.RouterEvent{}, false, whole(ev), DropRemote
	}
	tier, known := Tier(ev.Medium)
	if !known {
		return ckf.RouterEvent{}, false, whole(ev), DropMedium
	}
	ns := ev.Namespace
	if tier == ckf.TierDevice || tier == ckf.TierHostPinned {
		if why := c.groupFilter(ev, dpRank); why != DropNone {
			return ckf.RouterEvent{}, false, whole(ev), why
		}
		if ns, why = c.namespace(ev, dpRank, tier); why != DropNone {
			return ckf.RouterEvent{}, false, whole(ev), why
		}
	}
	out = ckf.RouterEvent{WorkerID: c.Worker, DPRank: dpRank, EventID: eventID, StorageTier: tier}
	switch ev.Type {
	case BlockStored:
		out.Kind = ckf.EventStored
		out.HasParent, out.ParentHash = ev.HasParent, ev.ParentHash
		if hasDuplicate(ev) {
			return ckf.RouterEvent{}, false, whole(ev), DropDuplicate
		}
		if ev.BlockSize != c.BlockSize {
			return ckf.RouterEvent{}, false, whole(ev), DropBlockSize
		}
		if ev.StringTokens {
			return ckf.RouterEvent{}, false, whole(ev), DropStringTokens
		}
		if ev.Eagle != c.Eagle {
			return ckf.RouterEvent{}, false, whole(ev), DropHashFormat
		}
		salt := ckf.Salt(ev.LoRAName, ns)
		n := min(len(ev.BlockHashes), ckf.BlockCount(len(ev.TokenIDs), c.BlockSize, ev.Eagle))
		if n < len(ev.BlockHashes) {
			dropped, why = len(ev.BlockHashes)-n, DropShortTokens
		}
		if n == 0 {
			return ckf.RouterEvent{}, false, dropped, why
		}
		w := c.BlockSize
		if ev.Eagle {
			w++
		}
		out.Blocks = c.blocks.take(n, math.MaxInt)[:n]
		c.blocks.commit(n)
		for i := range n {
			toks := ev.TokenIDs[i*c.BlockSize : i*c.BlockSize+w]
			var mm []uint64
			if i < len(ev.MM) {
				mm = ev.MM[i]
			}
			var th uint64
			if pads, ok := c.normalize(toks, mm); ok {
				th = ckf.LocalBlockHash(pads, salt)
			} else {
				th = ckf.LocalBlockHashMM(toks, mm, salt)
			}
			out.Blocks[i] = ckf.StoredBlock{BlockHash: ev.BlockHashes[i], TokensHash: th}
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

// whole is what dropping all of ev counts: its blocks, or 1 for an event
// without any (docs/ingest.md), as the drop reasons count it.
func whole(ev *Event) int { return max(len(ev.BlockHashes), 1) }

// normalize returns a block's tokens with its placeholder runs replaced by
// the pad values of its multimodal hashes, when Dynamo's converter would
// (convert.rs create_stored_block_from_parts): with a video token
// configured, only for an exact mapping of runs onto hashes; else, with an
// image token configured, when the block holds that token. ok false: the
// block is hashed with its mm hashes appended (none: plain tokens).
func (c *Converter) normalize(toks []uint32, mm []uint64) ([]uint32, bool) {
	switch {
	case len(mm) == 0:
		return nil, false
	case c.HasVideoToken:
		return placeholderRuns(toks, c.ImageTokenID, c.HasImageToken, c.VideoTokenID, mm)
	case c.HasImageToken && slices.Contains(toks, c.ImageTokenID):
		return substitutePads(toks, c.ImageTokenID, mm), true
	}
	return nil, false
}

// placeholderRuns maps the image and video placeholder runs of toks onto the
// mm hashes in order: each image run is one object, and consecutive video
// runs (a video's timestamp-separated frames) are one object. Only when the
// objects found equal the hashes in number are the runs replaced by their
// pad values; no runs, a count mismatch, or an image token equal to the
// video token is no mapping (Dynamo convert.rs
// normalize_mm_placeholder_runs).
func placeholderRuns(toks []uint32, image uint32, hasImage bool, video uint32, mm []uint64) ([]uint32, bool) {
	if hasImage && image == video {
		return nil, false
	}
	const none, img, vid = 0, 1, 2
	kind := func(t uint32) int {
		switch {
		case hasImage && t == image:
			return img
		case t == video:
			return vid
		}
		return none
	}
	out := slices.Clone(toks)
	objects, prev := 0, none
	// Two passes: count the objects, then fill only when they match.
	for pass := range 2 {
		objects, prev = 0, none
		for i := 0; i < len(toks); {
			k := kind(toks[i])
			if k == none {
				i++
				continue
			}
			if k == img || prev != vid {
				objects++
			}
			j := i + 1
			for j < len(toks) && kind(toks[j]) == k {
				j++
			}
			if pass == 1 {
				pad := ckf.PadValue(mm[objects-1])
				for x := i; x < j; x++ {
					out[x] = pad
				}
			}
			prev, i = k, j
		}
		if pass == 0 && (objects == 0 || objects != len(mm)) {
			return nil, false
		}
	}
	return out, true
}

// substitutePads replaces the n-th run of image tokens by the pad value of
// the n-th mm hash (the last one when runs outnumber hashes), in wire order
// (Dynamo zmq_wire/convert.rs substitute_pad_values).
func substitutePads(toks []uint32, image uint32, mm []uint64) []uint32 {
	out := make([]uint32, len(toks))
	obj, inRun := 0, false
	var pad uint32
	for i, t := range toks {
		if t != image {
			if inRun {
				inRun = false
				obj++
			}
			out[i] = t
			continue
		}
		if !inRun {
			inRun = true
			pad = ckf.PadValue(mm[min(obj, len(mm)-1)])
		}
		out[i] = pad
	}
	return out
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
