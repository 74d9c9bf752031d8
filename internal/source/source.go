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
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/producer"
)

// Sink is the part of a pool's producer a source drives; producer.Handle
// implements it.
type Sink interface {
	// AdmitEvent queues one event of member ev.Member at sourceEpoch.
	AdmitEvent(ctx context.Context, sourceEpoch uint64, ev ckf.RouterEvent) error
	// ResetRank drops every block of m and records sourceEpoch as its epoch;
	// degraded marks a reset caused by lost events.
	ResetRank(ctx context.Context, sourceEpoch uint64, m ckf.Member, degraded bool) error
	// ReplaceRanks atomically replaces members' state (a rebuild from an
	// engine's snapshot).
	ReplaceRanks(ctx context.Context, reps []producer.RankReplacement) error
}

var _ Sink = producer.Handle{}

// Source is one running connection to engines.
type Source interface {
	// Run drives sink until ctx is done or the source fails for good; it
	// reconnects by itself on transient failures.
	Run(ctx context.Context, sink Sink) error
	// Status reports the source's health; safe to call concurrently with Run.
	Status() Status
}

// Status is a source's health as the catalog and metrics show it.
type Status struct {
	// Name identifies the source within its pool (e.g. "vllm@tcp://host:5557").
	Name string `json:"name"`
	// Engine is the configured engine kind ("vllm", "sglang", "trtllm", "dynamo").
	Engine string `json:"engine"`
	// State is "connecting", "live", "recovering", "degraded" or "stopped".
	State string `json:"state"`
	// Batches and Events count what was admitted.
	Batches uint64 `json:"batches"`
	Events  uint64 `json:"events"`
	// Rejected counts batches or events dropped as malformed; Dropped counts
	// events dropped on purpose (e.g. a block of the wrong size).
	Rejected uint64 `json:"rejected"`
	Dropped  uint64 `json:"dropped"`
	// Gaps, Replays, Resets and Restarts count recovery transitions.
	Gaps     uint64 `json:"gaps"`
	Replays  uint64 `json:"replays"`
	Resets   uint64 `json:"resets"`
	Restarts uint64 `json:"restarts"`
	// Degraded counts resets after a gap nothing could fill; Silences resets
	// of a rank silent past its timeout; Duplicates batches received twice
	// and skipped; Reconnects lost connections redialled.
	Degraded   uint64 `json:"degraded"`
	Silences   uint64 `json:"silences"`
	Duplicates uint64 `json:"duplicates"`
	Reconnects uint64 `json:"reconnects"`
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
	Epoch     uint64 `json:"epoch"`
	Seq       int64  `json:"seq"`
	Reason    string `json:"reason,omitempty"`
	Publisher string `json:"publisher,omitempty"`
}
