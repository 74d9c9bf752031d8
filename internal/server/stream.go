package server

import (
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/connlimit"
	"github.com/ckfrelay/ckfrelay/internal/hub"
	"github.com/ckfrelay/ckfrelay/wire"
)

// handleStream serves one remote consumer lane: a chunked snapshot from the
// hub, then every delta since re-stamped with the subscriber's lease,
// heartbeats while idle, and a close frame when the stream ends.
func (s *Server) handleStream(w http.ResponseWriter, r *http.Request) error {
	p, err := s.pool(r)
	if err != nil {
		return err
	}
	g, err := p.serving()
	if err != nil {
		return err
	}
	consumer, err := uintParam(r, "consumer", true)
	if err != nil {
		return err
	}
	lane, err := uintParam(r, "lane", true)
	if err != nil {
		return err
	}
	if lane >= ckf.MaxLanes {
		return apiErr(http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("lane %d outside 0..%d", lane, ckf.MaxLanes-1))
	}
	epoch, err := uintParam(r, "epoch", true)
	if err != nil {
		return err
	}
	if lead := time.Duration(s.cfg.MaxLeaseEpochLead); epoch > uint64(time.Now().UnixNano())+uint64(lead) {
		return apiErr(http.StatusBadRequest, CodeEpochOutOfRange, fmt.Sprintf(
			"epoch %d is more than max_lease_epoch_lead %v ahead of the relay clock (%d ns since 1970); assignment epochs are clock readings or counters",
			epoch, lead, time.Now().UnixNano()))
	}
	lease := ckf.LaneLease{ConsumerInstance: consumer, PhysicalLane: uint8(lane), AssignmentEpoch: epoch}
	sub, err := g.hub.SubscribeFrom(lease, connlimit.Client(r.RemoteAddr))
	if err != nil {
		return err
	}
	defer sub.Cancel()
	w.Header().Set("Content-Type", FramesContentType)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	snap := sub.Snapshot()
	st := &stream{s: s, p: p, rc: http.NewResponseController(w), fw: wire.NewWriter(w, s.cfg.MaxFrameBytes),
		lease: lease, last: snap.Sequence, identity: snap.Identity}
	if !st.snapshot(sub) {
		return nil
	}

	hb := time.NewTicker(time.Duration(s.cfg.HeartbeatInterval))
	defer hb.Stop()
	stall := newStallDetector(r.Context(), time.Duration(s.cfg.StreamStallTimeout))
	for {
		wake := sub.Wait()
		d, ok, err := sub.Poll()
		switch {
		case ok:
			if !st.delta(d) {
				return nil
			}
			continue // write everything already logged before one flush
		case err != nil:
			st.end(err)
			return nil
		}
		_ = st.rc.Flush()
		select {
		case <-wake:
		case now := <-hb.C:
			if p.ha != nil && !p.ha.leadsNow() {
				// A deposed leader whose loop has not retired the
				// generation yet: no heartbeat may say its state is live.
				// The router reconnects and finds the leader.
				return nil
			}
			if stall.stalled(now) {
				s.m.stalled.WithLabelValues(p.spec.Name).Inc()
				s.log.Warn("stream: subscriber stopped reading; dropping it", "pool", p.spec.Name,
					"consumer", lease.ConsumerInstance, "lane", lease.PhysicalLane, "stall_timeout", time.Duration(s.cfg.StreamStallTimeout))
				return nil
			}
			if st.write(&wire.Frame{Kind: wire.KindHeartbeat, Heartbeat: wire.Heartbeat{Identity: st.identity, Lease: lease,
				LastSequence: st.last, UnixMicros: time.Now().UnixMicro()}}) != nil {
				return nil
			}
		case <-r.Context().Done():
			return nil
		}
	}
}

// stream writes one subscriber's frames. Every frame gets its own write
// deadline: a subscriber that stops reading must not hold the handler or
// the shutdown forever, and a slow but live one must still be able to take a
// large snapshot chunk by chunk.
type stream struct {
	s         *Server
	p         *hostedPool
	rc        *http.ResponseController
	fw        *wire.Writer
	lease     ckf.LaneLease
	identity  ckf.ProducerIdentity
	last      uint64 // the last sequence written
	installed bool   // the whole snapshot is written
}

// write writes one frame under a fresh deadline.
func (st *stream) write(f *wire.Frame) error {
	_ = st.rc.SetWriteDeadline(time.Now().Add(time.Duration(st.s.cfg.StreamWriteTimeout)))
	return st.fw.WriteFrame(f)
}

// snapshot writes the subscription's snapshot in chunks of at most
// snapshotChunkBytes, each under its own deadline. Each chunk is copied out
// of the hub's shared generation just before it is written, so the stream
// holds one chunk of the table, never all of it (wire.Writer releases a
// buffer that large after each frame, so an idle subscriber does not keep
// one). If the subscription ends part way (lagged, superseded, shutdown) the
// rest is not written: the stream closes with the reason at once.
func (st *stream) snapshot(sub *hub.Subscription) bool {
	snap := sub.Snapshot()
	per, err := wire.ChunkWords(min(st.s.cfg.MaxFrameBytes, snapshotChunkBytes))
	if err != nil {
		st.s.log.Error("stream: cannot chunk snapshot", "pool", st.p.spec.Name, "err", err)
		return false
	}
	total := int(snap.Identity.Format.BucketCount)
	count := max(1, (total+per-1)/per)
	sb := getSnapshotBuffers(min(per, total))
	defer snapshotBuffers.Put(sb)
	buf := sb.words
	st.fw.Hold(sb.frame)
	defer func() { sb.frame = st.fw.Release() }()
	for i := range count {
		off := i * per
		n, err := sub.ReadSnapshot(off, buf)
		if err != nil {
			st.end(err)
			return false
		}
		f := wire.Frame{Kind: wire.KindSnapshotChunk, Snapshot: wire.SnapshotChunk{Identity: snap.Identity, Lease: snap.Lease,
			Sequence: snap.Sequence, ChunkIndex: uint32(i), ChunkCount: uint32(count), BucketOffset: uint64(off), Words: buf[:n]}}
		if st.write(&f) != nil {
			return false
		}
	}
	st.installed = true
	return st.rc.Flush() == nil
}

// snapshotBuffers recycles the two buffers a stream's snapshot needs — the
// words of one chunk and its encoded frame, 256 KiB each — from one stream
// to the next. Allocated per stream, and the frame per chunk, a flood of
// subscribers made the relay churn 4 MiB of garbage per subscriber of a
// 4 MiB table, and its RSS follow the collector's pacing rather than what
// the streams hold (cmd/relay TestE2E_SubscriberFloodIsBounded).
var snapshotBuffers sync.Pool

type snapshotBuffer struct {
	words []uint64
	frame []byte
}

func getSnapshotBuffers(words int) *snapshotBuffer {
	sb, _ := snapshotBuffers.Get().(*snapshotBuffer)
	if sb == nil {
		sb = &snapshotBuffer{}
	}
	if cap(sb.words) < words {
		sb.words = make([]uint64, words)
	}
	sb.words = sb.words[:words]
	return sb
}

// delta writes one delta. A delta whose frame would exceed the frame limit
// (a mass reset or rebuild of a large pool: deltas are never split, SPEC
// §4.4) cannot be sent; the stream then ends with a lagged close frame, so
// the subscriber resubscribes and gets the same state as a chunked snapshot,
// instead of the stream dying silently.
func (st *stream) delta(d ckf.Delta) bool {
	err := st.write(&wire.Frame{Kind: wire.KindDelta, Delta: d})
	if errors.Is(err, wire.ErrFrameTooLarge) {
		st.s.m.oversize.WithLabelValues(st.p.spec.Name).Inc()
		st.s.log.Warn("stream: delta exceeds the frame limit; closing for a resnapshot",
			"pool", st.p.spec.Name, "images", len(d.Images), "max_frame_bytes", st.s.cfg.MaxFrameBytes)
		st.close(wire.CloseLagged, fmt.Sprintf("delta %d→%d of %d images exceeds the %d-byte frame limit; resubscribe for a snapshot",
			d.BaseSequence, d.Sequence, len(d.Images), st.s.cfg.MaxFrameBytes))
		return false
	}
	if err != nil {
		return false
	}
	st.last = d.Sequence
	return true
}

func (st *stream) close(reason wire.CloseReason, msg string) {
	if st.write(&wire.Frame{Kind: wire.KindClose, Close: wire.Close{Reason: reason, Message: msg}}) != nil {
		return
	}
	_ = st.rc.Flush()
}

// end writes, after the subscription ended with cause (every delta it could
// still read has been written by then), a drain marker when the pool shut
// down cleanly after the whole snapshot was written, and a close frame.
func (st *stream) end(cause error) {
	reason := wire.CloseProducerChanged
	switch {
	case errors.Is(cause, hub.ErrLagged):
		reason = wire.CloseLagged
		st.s.m.lagged.WithLabelValues(st.p.spec.Name).Inc()
	case errors.Is(cause, errShuttingDown):
		reason = wire.CloseShuttingDown
		if st.installed && st.write(&wire.Frame{Kind: wire.KindDrainMarker, Drain: ckf.DrainMarker{Lease: st.lease, ExpectedSequence: st.last}}) != nil {
			return
		}
	case errors.Is(cause, errFenced), errors.Is(cause, hub.ErrSuperseded):
		reason = wire.CloseFenced
	}
	st.close(reason, fmt.Sprint(cause))
}
