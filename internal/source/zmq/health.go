package zmq

import (
	"encoding/hex"
	"time"

	"github.com/ckfrelay/ckfrelay/internal/catalog"
	"github.com/ckfrelay/ckfrelay/internal/source"
)

// StateFailing is source.StateFailing: here, for at least FailWindow every
// batch that carried anything was rejected or had every event dropped, and
// one still was within the last FailWindow (docs/ingest.md, "A source that
// hears nothing useful"), or the pool refused a rank's epoch.
const StateFailing = source.StateFailing

// DefaultFailWindow is how long a source must hear nothing useful before it
// reads failing.
const DefaultFailWindow = 10 * time.Second

// IngestOptions tune what the source does with the events it decodes.
type IngestOptions struct {
	// ImageTokenID, when set, is the model's image placeholder token:
	// multimodal blocks are hashed with the token runs substituted by pad
	// values instead of with their mm hashes appended (Dynamo's
	// image_token_id normalisation).
	ImageTokenID *uint32
	// VideoTokenID, when set, is the model's video placeholder token:
	// multimodal blocks are then normalised only when their image and video
	// runs map onto their mm hashes exactly (Dynamo's video_token_id
	// normalisation, docs/ingest.md).
	VideoTokenID *uint32
	// MaxNamespaceBlocks bounds the namespace table (default
	// DefaultMaxNamespaceBlocks).
	MaxNamespaceBlocks int
	// FailWindow: see StateFailing (default DefaultFailWindow).
	FailWindow time.Duration
}

// excerptBytes is how much of an offending payload the catalog shows (hex).
const excerptBytes = 32

// reasonLogEvery rate-limits the log line of each rejection or drop reason.
const reasonLogEvery = 10 * time.Second

// health is the source's record of what it could not use. Guarded by
// Source.mu.
type health struct {
	firstBad, lastBad time.Time // the current run of useless batches (zero: none)
	lastLog           map[string]time.Time
}

func newConverter(cfg Config) Converter {
	cv := Converter{Worker: cfg.Worker, BlockSize: cfg.BlockSize, Eagle: cfg.Eagle, MaxNamespaceBlocks: cfg.Ingest.MaxNamespaceBlocks}
	if cfg.Ingest.ImageTokenID != nil {
		cv.ImageTokenID, cv.HasImageToken = *cfg.Ingest.ImageTokenID, true
	}
	if cfg.Ingest.VideoTokenID != nil {
		cv.VideoTokenID, cv.HasVideoToken = *cfg.Ingest.VideoTokenID, true
	}
	return cv
}

func excerpt(payload []byte) string {
	return hex.EncodeToString(payload[:min(len(payload), excerptBytes)])
}

// noteBadLocked records a batch nothing of which could be used; it returns
// whether reason's log line is due. s.mu is held.
func (s *Source) noteBadLocked(now time.Time, reason string, payload []byte) bool {
	h := &s.health
	if h.firstBad.IsZero() {
		h.firstBad = now
	}
	h.lastBad = now
	s.st.LastDropReason = reason
	s.st.LastBadPayload = excerpt(payload)
	if h.lastLog == nil {
		h.lastLog = map[string]time.Time{}
	}
	if now.Sub(h.lastLog[reason]) < reasonLogEvery {
		return false
	}
	h.lastLog[reason] = now
	return true
}

// noteReject counts a rejected batch by reason.
func (s *Source) noteReject(reason Reason, payload []byte) bool {
	if s.st.RejectedByReason == nil {
		s.st.RejectedByReason = map[string]catalog.U64{}
	}
	s.st.RejectedByReason[string(reason)]++
	return s.noteBadLocked(time.Now(), string(reason), payload)
}

// batchDrops tallies one batch's dropped blocks by reason.
type batchDrops struct {
	n       map[DropReason]uint64
	last    DropReason
	events  int // events in the batch
	useless int // events of it dropped whole
}

func (b *batchDrops) add(why DropReason, blocks int, whole bool) {
	if whole {
		b.useless++
	}
	if why == DropNone {
		return
	}
	if b.n == nil {
		b.n = map[DropReason]uint64{}
	}
	b.n[why] += uint64(max(blocks, 1))
	b.last = why
}

// noteBatch records an applied batch: its drops by reason, and whether it
// was useful (admitted something), useless (had events, none admitted) or
// neither (empty: a heartbeat).
func (s *Source) noteBatch(b *batchDrops, payload []byte) {
	now := time.Now()
	var logWhy DropReason
	s.mu.Lock()
	if len(b.n) > 0 && s.st.DroppedByReason == nil {
		s.st.DroppedByReason = map[string]catalog.U64{}
	}
	for why, n := range b.n {
		s.st.DroppedByReason[string(why)] += catalog.U64(n)
	}
	switch {
	case b.events > 0 && b.useless == b.events:
		if s.noteBadLocked(now, string(b.last), payload) && b.last != DropNone {
			logWhy = b.last
		}
	case b.events > 0:
		s.health.firstBad, s.health.lastBad = time.Time{}, time.Time{}
		if b.last != DropNone {
			lastLog := s.health.lastLog[string(b.last)]
			if now.Sub(lastLog) >= reasonLogEvery {
				if s.health.lastLog == nil {
					s.health.lastLog = map[string]time.Time{}
				}
				s.health.lastLog[string(b.last)] = now
				logWhy = b.last
			}
		}
	}
	s.mu.Unlock()
	if logWhy != DropNone {
		s.log.Warn("zmq source: dropped events", "reason", string(logWhy), "payload", excerpt(payload))
	}
}

// overlayHealth turns a connected source's state into failing when the
// window says so. s.mu is held.
func (s *Source) overlayHealthLocked(st *source.Status, now time.Time) {
	if !s.health.failing(now, s.cfg.Ingest.FailWindow) {
		return
	}
	switch st.State {
	case "live", "degraded", "recovering":
		st.State = StateFailing
	}
}

// failing reports whether the run of useless batches has lasted w and is
// still going (its last batch less than w ago).
func (h *health) failing(now time.Time, w time.Duration) bool {
	return !h.firstBad.IsZero() && now.Sub(h.firstBad) >= w && now.Sub(h.lastBad) < w
}
