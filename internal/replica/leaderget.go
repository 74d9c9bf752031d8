package replica

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Reads through a stream's leader. The streams the replicas read are
// created with AllowDirect, so nats.go reads them by direct gets, which any
// replica of the stream that was once caught up answers — also one that
// has fallen behind since: nats-server v2.15.2 subscribes a follower to
// the direct get subjects once it is current or 90% caught up
// (jetstream_cluster.go monitorStream) and does not unsubscribe it when it
// falls behind (a NATS node cut off from its cluster answers from what it
// had). That is the right read for a rebuild's fast path — it works
// without a stream leader — but not for a verdict: ErrStateLost stops a
// replica for good, so startPool and takeOver confirm it with reads the
// stream's leader answers ($JS.API.STREAM.MSG.GET) before they conclude it.

// apiPrefix is the JetStream API prefix (the relay connects without a
// domain: jetstream.New).
const apiPrefix = "$JS.API."

// leaderGetRequest is a JetStream message-get request (nats-server
// server/jetstream_api.go JSApiMsgGetRequest: seq, last_by_subj,
// next_by_subj).
type leaderGetRequest struct {
	Seq     uint64 `json:"seq,omitempty"`
	LastFor string `json:"last_by_subj,omitempty"`
	NextFor string `json:"next_by_subj,omitempty"`
}

// leaderGet reads one message of stream through the stream's leader,
// within CheckpointRequestTimeout. A stream without a leader does not
// answer: the read fails (it is not retried here), it never answers from
// a replica behind.
func leaderGet(ctx context.Context, nc *nats.Conn, stream string, req leaderGetRequest) (*jetstream.RawStreamMsg, error) {
	ctx, cancel := bounded(ctx)
	defer cancel()
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	m, err := nc.RequestWithContext(ctx, apiPrefix+"STREAM.MSG.GET."+stream, body)
	if err != nil {
		return nil, fmt.Errorf("replica: reading %s through its leader: %w", stream, err)
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error,omitempty"`
		Message *struct {
			Subject string `json:"subject"`
			Seq     uint64 `json:"seq"`
			Header  []byte `json:"hdrs,omitempty"`
			Data    []byte `json:"data,omitempty"`
		} `json:"message,omitempty"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return nil, fmt.Errorf("replica: reading %s through its leader: %w", stream, err)
	}
	if resp.Error != nil {
		if resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return nil, jetstream.ErrMsgNotFound
		}
		return nil, fmt.Errorf("replica: reading %s through its leader: %w", stream, resp.Error)
	}
	if resp.Message == nil {
		return nil, fmt.Errorf("replica: reading %s through its leader: %w", stream, jetstream.ErrInvalidJetStreamResponse)
	}
	out := &jetstream.RawStreamMsg{Subject: resp.Message.Subject, Sequence: resp.Message.Seq, Data: resp.Message.Data}
	if len(resp.Message.Header) > 0 {
		if out.Header, err = nats.DecodeHeadersMsg(resp.Message.Header); err != nil {
			return nil, fmt.Errorf("replica: reading %s through its leader: %w", stream, err)
		}
	}
	return out, nil
}

// lookups are the reads a rebuild decides from: the pool's kept
// checkpoints (the index), the subject's last sequence and its first
// message's predecessor.
type lookups struct {
	list      func(context.Context) ([]uint64, error)
	tail      func(context.Context) (uint64, error)
	firstPrev func(context.Context) (uint64, error)
}

// directLookups read by direct gets: any current replica answers, also
// while the streams have no leader.
func (n *Node) directLookups() lookups {
	l := lookups{
		tail: func(ctx context.Context) (uint64, error) {
			return directGet(ctx, func(ctx context.Context) (uint64, error) { return Tail(ctx, n.cfg.Stream, n.subject) })
		},
		firstPrev: func(ctx context.Context) (uint64, error) {
			return directGet(ctx, func(ctx context.Context) (uint64, error) { return FirstPrev(ctx, n.cfg.Stream, n.subject) })
		},
	}
	if cs := n.cfg.Checkpoints; cs != nil {
		l.list = func(ctx context.Context) ([]uint64, error) { return cs.List(ctx, n.cfg.Pool) }
	}
	return l
}

// leaderLookups read through the streams' leaders: what they say is the
// stream's state, not a replica's view of an older one.
func (n *Node) leaderLookups() lookups {
	nc, stream := n.cfg.JS.Conn(), n.cfg.Stream.CachedInfo().Config.Name
	l := lookups{
		tail: func(ctx context.Context) (uint64, error) {
			return lastSeq(leaderGet(ctx, nc, stream, leaderGetRequest{LastFor: n.subject}))
		},
		firstPrev: func(ctx context.Context) (uint64, error) {
			return firstPrev(leaderGet(ctx, nc, stream, leaderGetRequest{Seq: 1, NextFor: n.subject}))
		},
	}
	if cs := n.cfg.Checkpoints; cs != nil {
		l.list = func(ctx context.Context) ([]uint64, error) {
			m, err := leaderGet(ctx, nc, "KV_"+cs.indexBucket(), leaderGetRequest{LastFor: "$KV." + cs.indexBucket() + "." + n.cfg.Pool})
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				return nil, nil
			}
			if err != nil {
				return nil, err
			}
			if op := m.Header.Get("KV-Operation"); op != "" { // a delete or purge marker
				return nil, nil
			}
			return parseIndex(m.Data)
		}
	}
	return l
}
