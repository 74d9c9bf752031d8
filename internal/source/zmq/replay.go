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

// Replay asks the engine's replay (ROUTER) socket at ep for every buffered
// batch from sequence start on and returns them in the order sent, up to the
// end marker. It accepts both reply layouts engines have shipped: [seq,
// payload] and [topic, seq, payload] (each after the DEALER's empty
// delimiter). It gives up after timeout or beyond maxBatches replies, and
// with [ErrReplayOverrun] as soon as the first reply is not start (an engine
// answers with its whole buffer; there is no point receiving it). The
// timeout covers the dial and the ZMTP handshake too: a tcp:// endpoint goes
// through the source's guarded transport, whose handshake ends at the
// context's deadline.
func Replay(ctx context.Context, ep string, start int64, timeout time.Duration, maxBatches int) ([]Message, error) {
	g := *guardOf(ctx)
	g.own = zmq4.Dealer
	ctx, cancel := context.WithTimeout(withGuard(ctx, g), timeout)
	defer cancel()
	d := zmq4.NewDealer(ctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(timeout),
		zmq4.WithTimeout(timeout), zmq4.WithLogger(zmqLogger))
	defer d.Close()
	if err := d.Dial(subEndpoint(ep)); err != nil {
		return nil, fmt.Errorf("%w: dial %s: %v", ErrReplay, ep, err)
	}
	req := binary.BigEndian.AppendUint64(nil, uint64(start))
	if err := d.SendMulti(zmq4.NewMsgFrom([]byte{}, req)); err != nil {
		return nil, fmt.Errorf("%w: request: %v", ErrReplay, err)
	}
	var out []Message
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
		if len(out) >= maxBatches {
			return nil, fmt.Errorf("%w: more than %d batches", ErrReplay, maxBatches)
		}
		out = append(out, rep)
	}
}

// ParseReplayReply reads one replay reply in either layout: its last two
// frames are the 8-byte sequence and the payload; before them an optional
// topic, before that an optional empty delimiter.
func ParseReplayReply(frames [][]byte) (Message, error) {
	n := len(frames)
	if n < 2 || n > 4 || len(frames[n-2]) != 8 || (n == 4 && len(frames[0]) != 0) {
		return Message{}, malformed(ReasonFrames, nil, "replay reply of %d frames is neither [seq, payload] nor [topic, seq, payload]", n)
	}
	m := Message{Seq: int64(binary.BigEndian.Uint64(frames[n-2])), Payload: frames[n-1]}
	if n >= 3 {
		m.Topic = frames[n-3]
	}
	return m, nil
}
