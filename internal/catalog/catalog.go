// Package catalog is the JSON shape of a relay's pool catalog, GET /v1/pools:
// what a router host needs to configure a consumer (the routing domain, each
// pool's id and format) and to see how each pool is doing. The relay writes
// it (internal/server); the demo, the end-to-end tests and routers in other
// languages (js/) read it. README.md "Bootstrap" documents it.
//
// Every 64-bit integer (dc_id, producer_incarnation, seed, sequences,
// counters) is a decimal JSON string ([U64]): JavaScript and many JSON
// parsers read numbers as float64 and would round a seed or an incarnation
// above 2^53.
package catalog

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// U64 is a uint64 carried in JSON as a decimal string, so readers without
// 64-bit integers read it exactly.
type U64 uint64

// MarshalJSON implements json.Marshaler.
func (u U64) MarshalJSON() ([]byte, error) {
	return strconv.AppendQuote(nil, strconv.FormatUint(uint64(u), 10)), nil
}

// UnmarshalJSON implements json.Unmarshaler. Only a decimal string is
// accepted: a bare number may already have been rounded by its writer.
func (u *U64) UnmarshalJSON(b []byte) error {
	s, err := strconv.Unquote(string(b))
	if err != nil {
		return fmt.Errorf("catalog: u64 must be a decimal string, got %s", b)
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return fmt.Errorf("catalog: u64 %q: %w", s, err)
	}
	*u = U64(v)
	return nil
}

// I64 is an int64 carried in JSON as a decimal string, like [U64].
type I64 int64

// MarshalJSON implements json.Marshaler.
func (i I64) MarshalJSON() ([]byte, error) {
	return strconv.AppendQuote(nil, strconv.FormatInt(int64(i), 10)), nil
}

// UnmarshalJSON implements json.Unmarshaler; only a decimal string is
// accepted, as for [U64].
func (i *I64) UnmarshalJSON(b []byte) error {
	s, err := strconv.Unquote(string(b))
	if err != nil {
		return fmt.Errorf("catalog: i64 must be a decimal string, got %s", b)
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return fmt.Errorf("catalog: i64 %q: %w", s, err)
	}
	*i = I64(v)
	return nil
}

// Catalog is the body of GET /v1/pools.
type Catalog struct {
	Pools []Pool `json:"pools"`
}

// Pool returns the named pool's entry, or nil.
func (c *Catalog) Pool(name string) *Pool {
	for i := range c.Pools {
		if c.Pools[i].Name == name {
			return &c.Pools[i]
		}
	}
	return nil
}

// Pool is one pool of the catalog.
type Pool struct {
	Name string `json:"name"`
	DCID U64    `json:"dc_id"`
	// RouterKey is equal for two pools exactly when one router's consumer can
	// hold both: the same routing domain (both digests and their sources).
	// Formats may differ (each lane has its own, SPEC §8.2); a router that
	// asks one request of several pools also needs their Query semantics
	// to agree. See [RouterKey].
	RouterKey string   `json:"router_key"`
	Identity  Identity `json:"identity"`
	// Query is how a router hashes a request's tokens for this pool.
	Query QuerySemantics `json:"query_semantics"`
	Hub   Hub            `json:"hub"`
	Stats *Stats         `json:"stats,omitempty"`
	// Sources are the engine sources the pool subscribes to (docs/ingest.md).
	Sources []SourceStatus `json:"sources,omitempty"`
	// Persistence is set with a data dir: what was recovered at start and
	// how far the journal has reached the disk.
	Persistence *Persistence `json:"persistence,omitempty"`
	// HA is set when the relay runs the pool as one replica of a group
	// (ha.nats_url): its role and how far it has applied the records.
	HA    *HA    `json:"ha,omitempty"`
	Error string `json:"error,omitempty"`
}

// HA is a replicated pool's state on one replica (SPEC §11).
type HA struct {
	Role          string `json:"role"`             // "leader" or "standby"
	Leader        string `json:"leader,omitempty"` // the term's leader's node id
	LeaderAddress string `json:"leader_address,omitempty"`
	Term          U64    `json:"term"`
	// Applied is the stream sequence of the last record this replica
	// applied (a standby) or appended (the leader).
	Applied U64 `json:"applied"`
	// Lag is a standby's distance to the pool's last record, in stream
	// sequences (records of other pools sharing the stream count too, so
	// it is an upper bound on records); 0 on the leader.
	Lag       U64 `json:"lag"`
	Takeovers U64 `json:"takeovers"`
	// Rebuilds counts pools discarded and rebuilt from the stream.
	Rebuilds U64 `json:"rebuilds"`
	// DuplicateNodeID: another live relay leads the pool under this
	// replica's node id (a misconfiguration; each replica needs its own).
	DuplicateNodeID bool `json:"duplicate_node_id,omitempty"`
	// Halted, when set, is why the records chain halts at the record
	// after Applied (a record this replica cannot apply: it keeps its
	// state and retries); Stopped, why the replica stopped for good (its
	// records were lost). Either makes /readyz answer 503.
	Halted  string `json:"halted,omitempty"`
	Stopped string `json:"stopped,omitempty"`
	// LastError is why the replica last stopped leading or rebuilt its
	// pool (a refused or timed-out append: a full JetStream, no NATS
	// majority). LagUnknown: a standby could not read the pool's tail for
	// a while, so Lag is the last one it could read.
	LastError  string `json:"last_error,omitempty"`
	LagUnknown bool   `json:"lag_unknown,omitempty"`
	// Checkpoint is present while the replicas checkpoint (issue #34).
	Checkpoint *HACheckpoint `json:"checkpoint,omitempty"`
}

// HACheckpoint is a replica's view of its pool's checkpoints, as stream
// sequences of the records they include (0: none).
type HACheckpoint struct {
	// Loaded is the checkpoint this replica's pool started from (0: it
	// replayed the subject from its first record).
	Loaded U64 `json:"loaded"`
	// Stored is the last checkpoint this replica stored (standbys store them).
	Stored U64 `json:"stored"`
	// PurgedBelow is the stream sequence below which this replica last
	// purged the pool's records (the older kept checkpoint's).
	PurgedBelow U64 `json:"purged_below"`
}

// Identity is the pool's current producer identity (SPEC §2): with DCID it
// is everything a consumer manifest and an assignment need. Digests are 32
// hex digits; sources are "default_derived" or "explicit".
type Identity struct {
	CacheSemantics      string `json:"cache_semantics"`
	CacheSemanticsSrc   string `json:"cache_semantics_source"`
	RoutingScope        string `json:"routing_scope"`
	RoutingScopeSrc     string `json:"routing_scope_source"`
	ProducerIncarnation U64    `json:"producer_incarnation"`
	LayoutGeneration    U64    `json:"layout_generation"`
	Format              Format `json:"format"`
}

// Format is the filter format (SPEC §2).
type Format struct {
	Version         uint8 `json:"format_version"`
	Seed            U64   `json:"seed"`
	BucketCount     U64   `json:"bucket_count"`
	FingerprintBits uint8 `json:"fingerprint_bits"`
	SlotsPerBucket  uint8 `json:"slots_per_bucket"`
}

// QuerySemantics is a pool's token-to-sequence-hash pipeline, Dynamo's
// KvQuerySemantics: the block size (0 when the pool does not declare one)
// and the hash format (HashFormatStandard or HashFormatEagle). A router must
// refuse a format it does not know rather than fall back to another.
type QuerySemantics struct {
	BlockSize  int    `json:"block_size"`
	HashFormat string `json:"hash_format"`
}

// Hash formats (Dynamo's KvQueryHashFormat, snake_case).
const (
	HashFormatStandard = "dynamo_standard_v1" // block_size-token windows
	HashFormatEagle    = "dynamo_eagle_v1"    // block_size+1-token windows at a block_size stride
)

// ErrUnknownHashFormat is returned by [QuerySemantics.Eagle] for a format
// this version does not implement.
var ErrUnknownHashFormat = errors.New("catalog: unknown hash format")

// Eagle reports whether queries for the pool hash Eagle windows
// (ckf.HashOptions.Eagle); an unknown format is [ErrUnknownHashFormat],
// never a fallback.
func (q QuerySemantics) Eagle() (bool, error) {
	switch q.HashFormat {
	case HashFormatStandard:
		return false, nil
	case HashFormatEagle:
		return true, nil
	}
	return false, fmt.Errorf("%w %q", ErrUnknownHashFormat, q.HashFormat)
}

// Hub is the pool's fan-out state.
type Hub struct {
	Ready       bool `json:"ready"`
	Sequence    U64  `json:"sequence"`
	Subscribers int  `json:"subscribers"`
	// Snapshot generations in flight and the shared delta log, within
	// snapshot_generations and subscriber_queue(_bytes).
	SnapshotGenerations int `json:"snapshot_generations"`
	SnapshotBytes       U64 `json:"snapshot_bytes"`
	LogDeltas           int `json:"log_deltas"`
	LogBytes            U64 `json:"log_bytes"`
}

// Stats is the pool's exact state, read from its actor.
type Stats struct {
	Members          int     `json:"members"`
	UniqueBlocks     int     `json:"unique_blocks"`
	ResidentBlocks   U64     `json:"resident_blocks"`
	UnknownRemovals  U64     `json:"unknown_removals"`
	CapacityFailures U64     `json:"capacity_failures"`
	Occupancy        float64 `json:"filter_occupancy"`
	EmittedImages    U64     `json:"emitted_images"`
	Sequence         U64     `json:"sequence"`
	MailboxDepth     int     `json:"mailbox_depth"`
	LastFault        string  `json:"last_fault,omitempty"`
	// StaleEventsDropped counts admitted events the actor dropped for a
	// superseded source epoch; Faults, admitted events it refused as faults.
	StaleEventsDropped U64 `json:"stale_events_dropped"`
	Faults             U64 `json:"faults"`
}

// FromIdentity returns the catalog form of id.
func FromIdentity(id ckf.ProducerIdentity) Identity {
	sem, scope := id.Pool.Domain.CacheSemantics, id.Pool.Domain.RoutingScope
	f := id.Format
	return Identity{
		CacheSemantics: hex.EncodeToString(sem.Digest[:]), CacheSemanticsSrc: sem.Source.String(),
		RoutingScope: hex.EncodeToString(scope.Digest[:]), RoutingScopeSrc: scope.Source.String(),
		ProducerIncarnation: U64(id.ProducerIncarnation), LayoutGeneration: U64(id.LayoutGeneration),
		Format: Format{Version: f.Version, Seed: U64(f.Seed), BucketCount: U64(f.BucketCount),
			FingerprintBits: f.FingerprintBits, SlotsPerBucket: f.SlotsPerBucket},
	}
}

// RouterKey returns 32 hex digits that are equal for two pools exactly when
// their routing domains are (with overwhelming probability: a truncated
// SHA-256). One consumer's lanes must share a domain (SPEC §8.2) but not a
// format, so a router follows pools of one key.
func RouterKey(d ckf.Domain) string {
	s := fmt.Sprintf("ckfrelay router key v2\x00%x/%d/%x/%d",
		d.CacheSemantics.Digest, d.CacheSemantics.Source, d.RoutingScope.Digest, d.RoutingScope.Source)
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:16])
}

// Get reads base's catalog (base is the relay URL, e.g.
// "http://127.0.0.1:7878"); token, when set, is sent as a bearer token.
func Get(ctx context.Context, hc *http.Client, base, token string) (Catalog, error) {
	var c Catalog
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/v1/pools", nil)
	if err != nil {
		return c, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return c, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return c, fmt.Errorf("catalog: %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
		return c, fmt.Errorf("catalog: %w", err)
	}
	return c, nil
}

// Mismatch names a pool that cannot share a router with the first pool of
// its routing scope: the fields that differ (of [Identity]'s domain, or of
// [QuerySemantics]: a router asks one request of all its pools).
type Mismatch struct {
	Pool, First string
	Fields      []string
}

// Mismatches returns, for pools of one domain (equal router key: cache
// semantics and routing scope), every pool whose query semantics differ from
// the first such pool's, and why. A relay warns about them at start: a router
// that follows that domain cannot ask all of its pools one request. Formats
// (seed, bucket count) may differ: each lane has its own. Pools of other
// cache semantics in one routing scope are another model's, which a router
// selects apart (as Dynamo's relay hosts one pool per indexer domain), so
// they are never compared.
func Mismatches(pools []Pool) []Mismatch {
	var out []Mismatch
	first := map[string]*Pool{}
	for i := range pools {
		p := &pools[i]
		f, ok := first[p.RouterKey]
		if !ok {
			first[p.RouterKey] = p
			continue
		}
		if p.Query == f.Query {
			continue
		}
		var why []string
		for _, c := range []struct {
			name string
			same bool
		}{
			{"block_size", f.Query.BlockSize == p.Query.BlockSize},
			{"hash_format", f.Query.HashFormat == p.Query.HashFormat},
		} {
			if !c.same {
				why = append(why, c.name)
			}
		}
		out = append(out, Mismatch{Pool: p.Name, First: f.Name, Fields: why})
	}
	return out
}

// SourceStatus is an engine source's health as the catalog and metrics show it.
type SourceStatus struct {
	// Name identifies the source within its pool (e.g. "vllm@tcp://host:5557").
	Name string `json:"name"`
	// Engine is the configured engine kind ("vllm", "sglang", "trtllm", "dynamo").
	Engine string `json:"engine"`
	// State is "connecting", "live", "recovering", "degraded", "failing"
	// (connected, but for a while every batch was rejected or had every
	// event dropped, or a rank's epoch is refused; LastError or
	// LastDropReason says why) or "stopped".
	State string `json:"state"`
	// Batches and Events count what was admitted.
	Batches U64 `json:"batches"`
	Events  U64 `json:"events"`
	// Rejected counts batches or events dropped as malformed; Dropped counts
	// events dropped on purpose (e.g. a block of the wrong size).
	Rejected U64 `json:"rejected"`
	Dropped  U64 `json:"dropped"`
	// RejectedByReason and DroppedByReason split them by reason (a
	// rejection counts batches, a drop blocks, or 1 for an event without
	// blocks); LastDropReason is the reason of the last batch nothing of
	// which was used, LastBadPayload the first bytes of its payload (hex).
	RejectedByReason map[string]U64 `json:"rejected_by_reason,omitempty"`
	DroppedByReason  map[string]U64 `json:"dropped_by_reason,omitempty"`
	LastDropReason   string         `json:"last_drop_reason,omitempty"`
	LastBadPayload   string         `json:"last_bad_payload,omitempty"`
	// Gaps, Replays, Resets and Restarts count recovery transitions.
	Gaps     U64 `json:"gaps"`
	Replays  U64 `json:"replays"`
	Resets   U64 `json:"resets"`
	Restarts U64 `json:"restarts"`
	// Degraded counts resets after a gap nothing could fill; Silences resets
	// of a rank silent past its timeout; Duplicates batches received twice
	// and skipped; Reconnects lost connections redialled.
	Degraded   U64 `json:"degraded"`
	Silences   U64 `json:"silences"`
	Duplicates U64 `json:"duplicates"`
	Reconnects U64 `json:"reconnects"`
	// Reordered counts messages that arrived ahead of a hole in their
	// publisher's sequence and were applied in order once a redelivery
	// filled it; Held is how many wait for that now (a Dynamo JetStream
	// source: docs/ingest.md "Redeliveries out of order").
	Reordered U64 `json:"reordered"`
	Held      int `json:"held"`
	// PeersRefused counts connections dropped for their peer's fault: a
	// handshake that was not ZMTP or not completed in time, a frame larger
	// than the source's max_message_bytes, a peer beyond max_peers or
	// max_peers_per_client, an idle (never-published) peer closed for a newcomer.
	PeersRefused U64 `json:"peers_refused"`
	// Ranks is the state of each data-parallel rank the source has heard.
	Ranks []RankStatus `json:"ranks,omitempty"`
	// LastEvent is when the source last heard anything (events or a heartbeat).
	LastEvent time.Time `json:"last_event,omitzero"`
	// LastError is the most recent failure, if any.
	LastError string `json:"last_error,omitempty"`
}

// RankStatus is one rank of a source: its state ("live", "degraded",
// "reset"), the source epoch it is admitted at, the last sequence applied,
// why it is not live, and the engine's publisher id (hex) when it sends one.
type RankStatus struct {
	DPRank    uint32 `json:"dp_rank"`
	State     string `json:"state"`
	Epoch     U64    `json:"epoch"`
	Seq       I64    `json:"seq"`
	Reason    string `json:"reason,omitempty"`
	Publisher string `json:"publisher,omitempty"`
}

// Persistence is a pool's crash-recovery state (data_dir).
type Persistence struct {
	// Recovered says the pool started from stored state; RecoveredAgeSeconds
	// is how old that state was when the relay started (since its last
	// write), StateWrittenAt when it was written (RFC 3339).
	Recovered           bool    `json:"recovered"`
	StateWrittenAt      string  `json:"state_written_at,omitempty"`
	RecoveredAgeSeconds float64 `json:"recovered_age_seconds,omitempty"`
	RecoveredBlocks     int     `json:"recovered_checkpoint_blocks,omitempty"`
	// Recovery is "complete" when the stored journal reached its
	// high-water mark, "partial" when it ended before it (the newest
	// write-ahead log was damaged or deleted): LostCommands journalled
	// commands are gone, and the ResetRanks recovered ranks were reset
	// (degraded) so no stale block is advertised; "unverified" when state
	// was stored but its high-water mark file is missing or damaged
	// (HighWaterMark says which): a lost tail cannot be ruled out. Empty
	// when nothing was stored.
	Recovery      string `json:"recovery,omitempty"`
	HighWaterMark string `json:"high_water_mark,omitempty"`
	LostCommands  U64    `json:"lost_commands,omitempty"`
	ResetRanks    int    `json:"reset_ranks,omitempty"`
	// JournalPosition counts the commands journalled, DurablePosition those
	// on disk; CheckpointPosition is where the stored checkpoint stands.
	JournalPosition    U64    `json:"journal_position"`
	DurablePosition    U64    `json:"durable_position"`
	CheckpointPosition U64    `json:"checkpoint_position"`
	WriteError         string `json:"write_error,omitempty"`
}

// Domain returns the routing domain the identity names: its two digests
// and their sources, parsed back from the catalog's hex and names.
func (i Identity) Domain() (ckf.Domain, error) {
	sem, err := ckf.ParseScopedDigest(i.CacheSemantics, i.CacheSemanticsSrc)
	if err != nil {
		return ckf.Domain{}, fmt.Errorf("catalog: cache_semantics: %w", err)
	}
	scope, err := ckf.ParseScopedDigest(i.RoutingScope, i.RoutingScopeSrc)
	if err != nil {
		return ckf.Domain{}, fmt.Errorf("catalog: routing_scope: %w", err)
	}
	return ckf.Domain{CacheSemantics: sem, RoutingScope: scope}, nil
}
