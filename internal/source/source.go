// Package source defines what an event source drives and reports, so that
// every way the relay hears engines (ZMQ publishers of vLLM, SGLang and
// TensorRT-LLM; Dynamo's NATS event plane; HTTP posts) admits events through
// one narrow interface and surfaces its health in one shape.
//
// A source converts an engine's events into [ckf.RouterEvent]s and owns its
// recovery (gaps, engine restarts, silence); the pool's producer actor stays
// the only place that checks and applies them.
package source

import (
	"context"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/catalog"
	"github.com/ckfrelay/ckfrelay/producer"
)

// Sink is the part of a pool's producer a source drives; producer.Handle
// implements it.
type Sink interface {
	// AdmitEvents queues evs, in order, at sourceEpoch, as one unit: all of
	// them or (on an error) none. The sink takes ownership of evs.
	AdmitEvents(ctx context.Context, sourceEpoch uint64, evs []ckf.RouterEvent) error
	// ResetRank drops every block of m and records sourceEpoch as its epoch;
	// degraded marks a reset caused by lost events.
	ResetRank(ctx context.Context, sourceEpoch uint64, m ckf.Member, degraded bool) error
	// ReplaceRanks atomically replaces members' state (a rebuild from an
	// engine's snapshot).
	ReplaceRanks(ctx context.Context, reps []producer.RankReplacement) error
}

// EpochSink is a Sink that also tells the member epochs the pool records
// (recovered from its data dir, or set by any writer: a source, an HTTP
// bridge); producer.Handle implements it. A source that owns epochs starts
// above them ([RecordedEpoch]).
type EpochSink interface {
	Sink
	// SourceEpoch returns m's current source epoch; ok is false when the
	// pool has none.
	SourceEpoch(m ckf.Member) (epoch uint64, ok bool)
}

var _ EpochSink = producer.Handle{}

// CursorSink is a Sink that also takes, with an admission, how far the
// source's stream it came from was admitted ([producer.Handle.AdmitEventsAt]):
// a replicated pool's records carry the cursors, so a new leader's source
// resumes after them (issue #34). A source uses it when its sink has it.
type CursorSink interface {
	Sink
	AdmitEventsAt(ctx context.Context, sourceEpoch uint64, evs []ckf.RouterEvent, cur producer.Cursor) error
}

var _ CursorSink = producer.Handle{}

// RecordedEpoch returns m's epoch as sink records it, when sink tells.
func RecordedEpoch(sink Sink, m ckf.Member) (uint64, bool) {
	if es, ok := sink.(EpochSink); ok {
		return es.SourceEpoch(m)
	}
	return 0, false
}

// ErrStaleEpoch matches the sink's refusal of a reset or replacement whose
// epoch is older than the member's ([producer.StaleSourceEpochError]).
var ErrStaleEpoch = producer.ErrStaleSourceEpoch

// Source is one running connection to engines.
type Source interface {
	// Run drives sink until ctx is done or the source fails for good; it
	// reconnects by itself on transient failures.
	Run(ctx context.Context, sink Sink) error
	// Status reports the source's health; safe to call concurrently with Run.
	Status() Status
}

// StateFailing is the source state operators alert on: connected, but what
// it hears cannot be used (every batch rejected or dropped for a while, or an
// epoch the pool refuses); Status.LastError or LastDropReason says why.
const StateFailing = "failing"

// Status is a source's health as the catalog and metrics show it; the
// shape is the catalog's (internal/catalog), where every JSON shape of
// GET /v1/pools lives.
type Status = catalog.SourceStatus

// RankStatus is one data-parallel rank of a source.
type RankStatus = catalog.RankStatus
