package zmq

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/go-zeromq/zmq4"
)

// ErrReplay is wrapped by every replay failure.
var ErrReplay = errors.New("zmq source: replay")

// ErrReplayOverrun is returned when the engine's buffer no longer holds the
// start sequence: its first reply is later than the one asked for.
var ErrReplayOverrun = fmt.Errorf("%w: the buffer no longer holds the start", ErrReplay)

// EndOfReplay is the sequence of the marker that ends a replay.
const EndOfReplay int64 = -1

// ReplayLimits bound one replay request.
type ReplayLimits struct {
	// Timeout bounds the whole request: dial, handshake and every reply.
	Timeout time.Duration
	// MaxBatches bounds the replies kept.
	MaxBatches int
	// MaxBytes bounds the bytes the kept replies hold (payloads and
	// topics); zero means no bound.
	MaxBytes int64
}

// Replay asks the engine's replay (ROUTER) socket at ep for the buffered
// batches of [start, end) and returns them in the order sent. It stops
// reading at the reply for end−1 (an engine answers with its whole buffer
// from start on: what follows the gap is not needed, and is not kept), or
// at the end marker when the buffer ends first; end = math.MaxInt64 reads
// to the marker. It accepts both reply layouts engines have shipped: [seq,
// payload] and [topic, seq, payload] (each after the DEALER's empty
// delimiter). It gives up after lim.Timeout or beyond lim.MaxBatches
// replies or lim.MaxBytes bytes kept (a peer answering with huge replies
// costs a bounded amount of memory), and with [ErrReplayOverrun] as soon as
// the first reply is not start (there is no point receiving the rest). The
// timeout covers the dial and the ZMTP handshake too: a tcp:// endpoint goes
// through the source's guarded transport, whose handshake ends at the
// context's deadline.
func Replay(ctx context.Context, ep string, start, end int64, lim ReplayLimits) ([]Message, error) {
	g := *guardOf(ctx)
	g.own = zmq4.Dealer
	ctx, cancel := context.WithTimeout(withGuard(ctx, g), lim.Timeout)
	defer cancel()
	d := zmq4.NewDealer(ctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(lim.Timeout),
		zmq4.WithTimeout(lim.Timeout), zmq4.WithLogger(zmqLogger))
	defer d.Close()
	if err := d.Dial(subEndpoint(ep)); err != nil {
		return nil, fmt.Errorf("%w: dial %s: %v", ErrReplay, ep, err)
	}
	req := binary.BigEndian.AppendUint64(nil, uint64(start))
	if err := d.SendMulti(zmq4.NewMsgFrom([]byte{}, req)); err != nil {
		return nil, fmt.Errorf("%w: request: %v", ErrReplay, err)
	}
	var out []Message
	var kept int64
	for {
		m, err := d.Recv()
		if err != nil {
			return nil, fmt.Errorf("%w: after %d batches: %v", ErrReplay, len(out), err)
		}
		rep, err := ParseReplayReply(m.Frames)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrReplay, err)
		}
		if rep.Seq == EndOfReplay {
			return out, nil
		}
		if len(out) == 0 && rep.Seq != start {
			return nil, fmt.Errorf("%w: asked for %d, first reply %d", ErrReplayOverrun, start, rep.Seq)
		}
		if rep.Seq >= end {
			return out, nil // past the range asked for: not kept
		}
		if len(out) >= lim.MaxBatches {
			return nil, fmt.Errorf("%w: more than %d batches", ErrReplay, lim.MaxBatches)
		}
		if kept += int64(len(rep.Payload) + len(rep.Topic)); lim.MaxBytes > 0 && kept > lim.MaxBytes {
			return nil, fmt.Errorf("%w: more than %d bytes after %d batches", ErrReplay, lim.MaxBytes, len(out))
		}
		out = append(out, rep)
		if rep.Seq == end-1 {
			return out, nil // [start, end) is covered
		}
	}
}

// ParseReplayReply reads one replay reply in either layout: its last two
// frames are the 8-byte sequence and the payload; before them an optional
// topic, before that an optional empty delimiter. Its sequence is
// [EndOfReplay] or in [0, 2^63-1] ([ReasonSequence] otherwise).
func ParseReplayReply(frames [][]byte) (Message, error) {
	n := len(frames)
	if n < 2 || n > 4 || len(frames[n-2]) != 8 || (n == 4 && len(frames[0]) != 0) {
		return Message{}, malformed(ReasonFrames, nil, "replay reply of %d frames is neither [seq, payload] nor [topic, seq, payload]", n)
	}
	m := Message{Seq: int64(binary.BigEndian.Uint64(frames[n-2])), Payload: frames[n-1]}
	if m.Seq < 0 && m.Seq != EndOfReplay {
		return Message{}, malformed(ReasonSequence, nil, "replay reply of sequence %d: only the end marker (-1) may be negative", m.Seq)
	}
	if n >= 3 {
		m.Topic = frames[n-3]
	}
	return m, nil
}
