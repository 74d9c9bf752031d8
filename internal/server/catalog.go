package server

import (
	"context"
	"net/http"
	"time"

	"github.com/ckfrelay/ckfrelay/internal/catalog"
)

// catalogPool is one entry of GET /v1/pools (the shape lives in
// internal/catalog, shared with its readers).
type catalogPool = catalog.Pool

// entry returns a pool's catalog entry without stats.
func (p *hostedPool) entry() catalogPool {
	g := p.gen()
	id := g.handle.Identity()
	hs := g.hub.Stats()
	return catalogPool{Name: p.spec.Name, DCID: catalog.U64(p.spec.DCID),
		RouterKey: catalog.RouterKey(id.Pool.Domain), Identity: catalog.FromIdentity(id),
		Query: catalog.QuerySemantics{BlockSize: p.spec.BlockSize, HashFormat: p.spec.HashFormat},
		Hub: catalog.Hub{Ready: hs.Ready, Sequence: catalog.U64(hs.Sequence), Subscribers: hs.Subscribers,
			SnapshotGenerations: hs.SnapshotGenerations, SnapshotBytes: catalog.U64(hs.SnapshotBytes),
			LogDeltas: hs.LogDeltas, LogBytes: catalog.U64(hs.LogBytes)}}
}

// RouterMismatches lists the pools that cannot share a router with the
// first pool of their routing scope (another seed or bucket count: see
// catalog.Mismatches). `relay serve` logs a warning for each.
func (s *Server) RouterMismatches() []catalog.Mismatch {
	pools := make([]catalogPool, 0, len(s.order))
	for _, p := range s.order {
		pools = append(pools, p.entry())
	}
	return catalog.Mismatches(pools)
}

// persistenceJSON is a pool's crash-recovery state, nil without a data dir;
// started is when this relay started.
func persistenceJSON(p *hostedPool, started time.Time) *catalog.Persistence {
	if p.journal == nil {
		return nil
	}
	st := p.journal.Stats()
	c := &catalog.Persistence{Recovered: st.Recovered, RecoveredBlocks: st.RecoveredBlocks,
		JournalPosition: catalog.U64(st.Position), DurablePosition: catalog.U64(st.Durable),
		CheckpointPosition: catalog.U64(st.Checkpoint), WriteError: st.WriteError}
	switch {
	case st.LostCommands > 0:
		c.Recovered = true // the mark says state was stored, even if none survived
		c.Recovery, c.LostCommands, c.ResetRanks = "partial", catalog.U64(st.LostCommands), st.ResetRanks
	case st.Unverified != "":
		c.Recovery, c.HighWaterMark = "unverified", st.Unverified
	case st.Recovered:
		c.Recovery = "complete"
	}
	if !st.RecoveredAt.IsZero() {
		c.StateWrittenAt = st.RecoveredAt.UTC().Format(time.RFC3339Nano)
		c.RecoveredAgeSeconds = max(0, started.Sub(st.RecoveredAt).Seconds())
	}
	return c
}

func (s *Server) handleCatalog(w http.ResponseWriter, r *http.Request) {
	out := make([]catalogPool, 0, len(s.order))
	for _, p := range s.order {
		e := p.entry()
		e.Sources = s.SourceStatuses(p.spec.Name)
		e.Persistence = persistenceJSON(p, time.Unix(0, int64(s.incarnation)))
		e.HA, _ = p.haStatus(r.Context()) // its own budget: haLookupBudget
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		st, err := p.actor().Stats(ctx)
		cancel()
		if err != nil {
			e.Error = err.Error()
		} else {
			ps := st.Pool
			p.mu.Lock()
			lf := p.lastFault
			p.mu.Unlock()
			e.Stats = &catalog.Stats{Members: ps.Members, UniqueBlocks: ps.UniqueBlocks,
				ResidentBlocks: catalog.U64(ps.ResidentBlocks), UnknownRemovals: catalog.U64(ps.UnknownRemovals),
				CapacityFailures: catalog.U64(ps.CapacityFailures),
				Occupancy:        float64(ps.OccupiedSlots) / float64(ps.FilterBytes/8*4), EmittedImages: catalog.U64(ps.EmittedImages),
				Sequence: catalog.U64(st.Sequence), MailboxDepth: p.actor().MailboxDepth(), LastFault: lf,
				StaleEventsDropped: catalog.U64(st.StaleEventsDropped), Faults: catalog.U64(st.Faults)}
		}
		out = append(out, e)
	}
	writeJSON(w, http.StatusOK, catalog.Catalog{Pools: out})
}
