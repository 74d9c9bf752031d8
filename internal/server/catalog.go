package server

import (
	"context"
	"encoding/hex"
	"net/http"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// catalogPool is one entry of GET /v1/pools.
type catalogPool struct {
	Name     string          `json:"name"`
	DCID     uint64          `json:"dc_id"`
	Identity catalogIdentity `json:"identity"`
	Hub      catalogHub      `json:"hub"`
	Stats    *catalogStats   `json:"stats,omitempty"`
	// Persistence is set with a data dir: what was recovered at start and
	// how far the journal has reached the disk.
	Persistence *catalogPersistence `json:"persistence,omitempty"`
	Error       string              `json:"error,omitempty"`
}

type catalogIdentity struct {
	CacheSemantics      string `json:"cache_semantics"`
	CacheSemanticsSrc   string `json:"cache_semantics_source"`
	RoutingScope        string `json:"routing_scope"`
	RoutingScopeSrc     string `json:"routing_scope_source"`
	ProducerIncarnation uint64 `json:"producer_incarnation"`
	LayoutGeneration    uint64 `json:"layout_generation"`
	Format              struct {
		Version         uint8  `json:"format_version"`
		Seed            uint64 `json:"seed"`
		BucketCount     uint64 `json:"bucket_count"`
		FingerprintBits uint8  `json:"fingerprint_bits"`
		SlotsPerBucket  uint8  `json:"slots_per_bucket"`
	} `json:"format"`
}

type catalogHub struct {
	Ready       bool   `json:"ready"`
	Sequence    uint64 `json:"sequence"`
	Subscribers int    `json:"subscribers"`
	// Snapshot generations in flight and the shared delta log, within
	// snapshot_generations and subscriber_queue(_bytes).
	SnapshotGenerations int   `json:"snapshot_generations"`
	SnapshotBytes       int64 `json:"snapshot_bytes"`
	LogDeltas           int   `json:"log_deltas"`
	LogBytes            int64 `json:"log_bytes"`
}

type catalogStats struct {
	Members          int     `json:"members"`
	UniqueBlocks     int     `json:"unique_blocks"`
	ResidentBlocks   uint64  `json:"resident_blocks"`
	UnknownRemovals  uint64  `json:"unknown_removals"`
	CapacityFailures uint64  `json:"capacity_failures"`
	Occupancy        float64 `json:"filter_occupancy"`
	EmittedImages    uint64  `json:"emitted_images"`
	Sequence         uint64  `json:"sequence"`
	MailboxDepth     int     `json:"mailbox_depth"`
	LastFault        string  `json:"last_fault,omitempty"`
}

type catalogPersistence struct {
	// Recovered says the pool started from stored state; RecoveredAgeSeconds
	// is how old that state was when the relay started (since its last
	// write), StateWrittenAt when it was written.
	Recovered           bool    `json:"recovered"`
	StateWrittenAt      string  `json:"state_written_at,omitempty"`
	RecoveredAgeSeconds float64 `json:"recovered_age_seconds,omitempty"`
	RecoveredBlocks     int     `json:"recovered_checkpoint_blocks,omitempty"`
	// JournalPosition counts the commands journalled, DurablePosition those
	// on disk; CheckpointPosition is where the stored checkpoint stands.
	JournalPosition    uint64 `json:"journal_position"`
	DurablePosition    uint64 `json:"durable_position"`
	CheckpointPosition uint64 `json:"checkpoint_position"`
	WriteError         string `json:"write_error,omitempty"`
}

func persistenceJSON(p *hostedPool, started time.Time) *catalogPersistence {
	if p.journal == nil {
		return nil
	}
	st := p.journal.Stats()
	c := &catalogPersistence{Recovered: st.Recovered, RecoveredBlocks: st.RecoveredBlocks,
		JournalPosition: st.Position, DurablePosition: st.Durable, CheckpointPosition: st.Checkpoint, WriteError: st.WriteError}
	if !st.RecoveredAt.IsZero() {
		c.StateWrittenAt = st.RecoveredAt.UTC().Format(time.RFC3339Nano)
		c.RecoveredAgeSeconds = max(0, started.Sub(st.RecoveredAt).Seconds())
	}
	return c
}

func identityJSON(id ckf.ProducerIdentity) catalogIdentity {
	var c catalogIdentity
	sem, scope := id.Pool.Domain.CacheSemantics, id.Pool.Domain.RoutingScope
	c.CacheSemantics, c.CacheSemanticsSrc = hex.EncodeToString(sem.Digest[:]), sem.Source.String()
	c.RoutingScope, c.RoutingScopeSrc = hex.EncodeToString(scope.Digest[:]), scope.Source.String()
	c.ProducerIncarnation, c.LayoutGeneration = id.ProducerIncarnation, id.LayoutGeneration
	f := id.Format
	c.Format.Version, c.Format.Seed, c.Format.BucketCount = f.Version, f.Seed, f.BucketCount
	c.Format.FingerprintBits, c.Format.SlotsPerBucket = f.FingerprintBits, f.SlotsPerBucket
	return c
}

func (s *Server) handleCatalog(w http.ResponseWriter, r *http.Request) {
	out := make([]catalogPool, 0, len(s.order))
	for _, p := range s.order {
		hs := p.hub.Stats()
		e := catalogPool{Name: p.spec.Name, DCID: p.spec.DCID, Identity: identityJSON(p.handle.Identity()),
			Hub: catalogHub{Ready: hs.Ready, Sequence: hs.Sequence, Subscribers: hs.Subscribers,
				SnapshotGenerations: hs.SnapshotGenerations, SnapshotBytes: hs.SnapshotBytes, LogDeltas: hs.LogDeltas, LogBytes: hs.LogBytes},
			Persistence: persistenceJSON(p, time.Unix(0, int64(s.incarnation)))}
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		st, err := p.handle.Stats(ctx)
		cancel()
		if err != nil {
			e.Error = err.Error()
		} else {
			ps := st.Pool
			p.mu.Lock()
			lf := p.lastFault
			p.mu.Unlock()
			e.Stats = &catalogStats{Members: ps.Members, UniqueBlocks: ps.UniqueBlocks, ResidentBlocks: ps.ResidentBlocks,
				UnknownRemovals: ps.UnknownRemovals, CapacityFailures: ps.CapacityFailures,
				Occupancy: float64(ps.OccupiedSlots) / float64(ps.FilterBytes/8*4), EmittedImages: ps.EmittedImages,
				Sequence: st.Sequence, MailboxDepth: p.handle.MailboxDepth(), LastFault: lf}
		}
		out = append(out, e)
	}
	writeJSON(w, http.StatusOK, map[string]any{"pools": out})
}
