package client

import (
	"errors"
	"fmt"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wire"
)

// Session end causes beside the consumer's and the transport's.
var (
	// ErrProtocol: the stream broke a session rule (SPEC §9): a frame under
	// another lease than the session's, a stream that does not start with
	// chunk 0 of a snapshot, a chunk that is not the next one of the
	// session's snapshot or comes after it, or a heartbeat, delta or drain
	// marker inside the snapshot. The relay (or whatever is between) is
	// wrong; the session ends and nothing of the frame was applied.
	ErrProtocol = errors.New("client: stream broke the session protocol")
	// ErrLeaseLost: the consumer no longer holds the session's lease on its
	// lane (a frame under it came back IgnoredForeignLease, or a consumer
	// instance reset — wasm/host's ErrInstanceReset — unassigned the lane),
	// so the lane is dark until a new session assigns it.
	ErrLeaseLost = errors.New("client: lane lost its lease in the consumer")
	// ErrSnapshotTimeout: the session's snapshot was not installed within
	// Config.SnapshotProgressTimeout of the stream's start.
	ErrSnapshotTimeout = errors.New("client: snapshot did not complete in time")
)

// Session applies one stream's frames to a consumer under one lane lease,
// with the rules every [Router] session follows on every transport:
//
//   - the stream starts with chunk 0 of a snapshot; its identity assigns the
//     lane under the session's lease;
//   - every frame that names a lease (snapshot chunk, delta, heartbeat,
//     drain marker) names the session's own, or it is [ErrProtocol] and is
//     not applied: one stream can never write into, drain or refresh
//     another lane, whatever it guesses;
//   - the session's one snapshot arrives chunk 0, 1, … of one sequence and
//     count with nothing between its chunks (SPEC §9: heartbeats start after
//     the snapshot); a repeated, skipped or late chunk is [ErrProtocol];
//   - an outcome that says the lane lost the lease (IgnoredForeignLease for
//     a frame under the session's own lease) is [ErrLeaseLost];
//     Deactivated and RetrySnapshot are [ErrDeactivated]; a close frame is
//     [ErrStreamClosed]. After any error the session is over: apply no
//     further frame to it.
//
// A frame of a kind this version does not know goes to the consumer, which
// ignores it (a newer relay may add kinds). Session is what Router runs per
// stream; it is exported for hosts that carry frames over a transport of
// their own. It is not safe for concurrent use; the Lanes it feeds may be
// shared with other sessions (on other lanes).
type Session struct {
	ls    Lanes
	lease ckf.LaneLease
	frame wire.Frame
	buf   []byte // ApplyDecoded's encoding for Lanes that take bytes only

	assigned  bool // the first chunk assigned the lane
	installed bool // the session's snapshot is installed
	snapSeq   uint64
	nextChunk uint32 // index of the next chunk of the snapshot
	chunks    uint32 // chunk count of the snapshot
}

// NewSession returns a session that applies frames to ls under lease.
func NewSession(ls Lanes, lease ckf.LaneLease) *Session {
	return &Session{ls: ls, lease: lease}
}

// Lease returns the session's lease.
func (s *Session) Lease() ckf.LaneLease { return s.lease }

// Assigned reports whether the session's first chunk assigned its lane.
func (s *Session) Assigned() bool { return s.assigned }

// Installed reports whether the session's snapshot is installed.
func (s *Session) Installed() bool { return s.installed }

// Apply checks one frame body (without its length prefix) against the
// session's rules and applies it. A frame that breaks them, or does not
// decode, is not applied: the error then matches [ErrProtocol] or the wire
// sentinels and the result's Lane is -1. Otherwise the result is the
// consumer's, and the error names what ends the session, if anything (see
// [Session]). raw is not retained.
func (s *Session) Apply(raw []byte) (consumer.Result, error) {
	none := consumer.Result{Lane: -1}
	f := &s.frame
	if err := wire.DecodeFrameView(raw, f); err != nil {
		if !errors.Is(err, wire.ErrUnknownKind) || !s.assigned {
			return none, err
		}
		f.Kind = 0 // a kind the consumer will ignore
	} else if err := s.check(f); err != nil {
		return none, err
	}
	return s.apply(f, raw)
}

// ApplyDecoded is [Session.Apply] for a frame already decoded (a transport
// that translates another encoding, gRPC's CBI1): the same rules, checked on
// f, and the consumer's result. f is applied with [DecodedApplier] when the
// session's Lanes has it, else encoded once for ApplyFrame. f is only read
// and not retained.
func (s *Session) ApplyDecoded(f *wire.Frame) (consumer.Result, error) {
	if err := s.check(f); err != nil {
		return consumer.Result{Lane: -1}, err
	}
	if _, ok := s.ls.(DecodedApplier); ok {
		return s.apply(f, nil)
	}
	var err error
	if s.buf, err = wire.AppendFrame(s.buf[:0], f); err != nil {
		return consumer.Result{Lane: -1}, err
	}
	if cap(s.buf) > maxRetainedFrameBytes {
		defer func() { s.buf = nil }()
	}
	return s.apply(f, s.buf)
}

// maxRetainedFrameBytes is the largest encoding buffer ApplyDecoded keeps
// between frames.
const maxRetainedFrameBytes = 64 << 10

// apply assigns the lane on the session's first frame, then applies f: raw,
// its encoding, with ApplyFrame, or f itself (raw nil) with the Lanes'
// DecodedApplier.
func (s *Session) apply(f *wire.Frame, raw []byte) (consumer.Result, error) {
	none := consumer.Result{Lane: -1}
	if !s.assigned {
		if err := s.ls.Assign(f.Snapshot.Identity, s.lease); err != nil {
			// A valid format refused is the manifest's pin: no retry can
			// pass it. An invalid one is the relay's fault and may be
			// transient, so it stays an ordinary (retried) session end.
			if errors.Is(err, consumer.ErrFormatMismatch) && f.Snapshot.Identity.Format.Validate() == nil {
				err = &FormatMismatchError{Lane: int(s.lease.PhysicalLane), Format: f.Snapshot.Identity.Format, Err: err}
			}
			return none, err
		}
		s.assigned = true
	}
	var res consumer.Result
	var err error
	if raw == nil {
		res, err = s.ls.(DecodedApplier).ApplyDecodedFrame(f)
	} else {
		res, err = s.ls.ApplyFrame(raw)
	}
	if err != nil {
		return res, err
	}
	switch res.Outcome {
	case consumer.SnapshotChunkAccepted:
		s.nextChunk++
	case consumer.SnapshotInstalled:
		s.installed = true
	case consumer.IgnoredForeignLease:
		return res, fmt.Errorf("%w: lane %d under epoch %d", ErrLeaseLost, s.lease.PhysicalLane, s.lease.AssignmentEpoch)
	case consumer.Deactivated, consumer.RetrySnapshot:
		return res, fmt.Errorf("%w: %v", ErrDeactivated, res.Fault)
	case consumer.StreamClosed:
		return res, ErrStreamClosed
	}
	return res, nil
}

// check applies the session's rules to a decoded frame.
func (s *Session) check(f *wire.Frame) error {
	lease, ok := f.Lease()
	if !ok { // a close frame names no lease
		if !s.assigned {
			return fmt.Errorf("%w: stream must start with a snapshot chunk, got a %v frame", ErrProtocol, f.Kind)
		}
		return nil
	}
	if lease != s.lease {
		return fmt.Errorf("%w: a %v frame under lease %+v on the session of %+v", ErrProtocol, f.Kind, lease, s.lease)
	}
	if f.Kind != wire.KindSnapshotChunk {
		if !s.installed {
			// SPEC §9: nothing but chunks until the snapshot is whole; a
			// heartbeat there would keep a stalled snapshot looking alive.
			return fmt.Errorf("%w: a %v frame inside the session's snapshot (chunk %d of %d next)", ErrProtocol, f.Kind, s.nextChunk, s.chunks)
		}
		return nil
	}
	c := &f.Snapshot
	switch {
	case s.installed:
		return fmt.Errorf("%w: snapshot chunk %d of %d at sequence %d after the session's snapshot", ErrProtocol, c.ChunkIndex, c.ChunkCount, c.Sequence)
	case c.ChunkIndex != s.nextChunk:
		return fmt.Errorf("%w: snapshot chunk %d, want chunk %d", ErrProtocol, c.ChunkIndex, s.nextChunk)
	case c.ChunkIndex > 0 && (c.Sequence != s.snapSeq || c.ChunkCount != s.chunks):
		return fmt.Errorf("%w: snapshot chunk %d of %d at sequence %d continues chunk %d of %d at sequence %d",
			ErrProtocol, c.ChunkIndex, c.ChunkCount, c.Sequence, s.nextChunk-1, s.chunks, s.snapSeq)
	}
	s.snapSeq, s.chunks = c.Sequence, c.ChunkCount
	return nil
}
