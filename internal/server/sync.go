package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/ckfrelay/ckfrelay/producer"
)

// CodePublishTimeout answers a ?sync=published ingest request whose events
// were admitted but not on the pool's stream within SyncPublishedTimeout.
const CodePublishTimeout = "publish_timeout"

// SyncPublishedTimeout bounds how long a ?sync=published ingest request waits,
// after admission, for its events to be on the pool's stream; past it the
// request is answered 504 publish_timeout (the events stay admitted). A var
// so tests can shorten it.
var SyncPublishedTimeout = 10 * time.Second

// syncPublished wraps an ingest handler, outside its ingest slot, with the
// write barrier of ?sync=published: the handler's success answer is held
// until awaitPublished says the change is on the pool's stream (or is
// replaced by its 504/503). Without the parameter the handler runs as is; a
// handler error (nothing admitted, or a partial admission) is answered at
// once, as without it. A bad value is refused before the handler runs.
func (s *Server) syncPublished(h func(http.ResponseWriter, *http.Request) error) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		published, err := syncParam(r)
		if err != nil || !published {
			if err != nil {
				return err
			}
			return h(w, r)
		}
		p, err := s.pool(r)
		if err != nil {
			return err
		}
		held := &heldResponse{ResponseWriter: w}
		if err := h(held, r); err != nil {
			return err
		}
		if held.status == 0 {
			held.status = http.StatusOK
		}
		if held.status/100 == 2 {
			if err := s.awaitPublished(r.Context(), p, held.body.Bytes()); err != nil {
				return err
			}
		}
		w.WriteHeader(held.status)
		_, _ = w.Write(held.body.Bytes())
		return nil
	}
}

// heldResponse keeps a handler's status and body for syncPublished; headers
// and the connection controls (read deadlines: Unwrap) are the real ones.
type heldResponse struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (h *heldResponse) WriteHeader(status int) {
	if h.status == 0 {
		h.status = status
	}
}

func (h *heldResponse) Write(b []byte) (int, error) {
	if h.status == 0 {
		h.status = http.StatusOK
	}
	return h.body.Write(b)
}

func (h *heldResponse) Unwrap() http.ResponseWriter { return h.ResponseWriter }

// syncParam reads the ingest requests' optional sync parameter: "" (answer
// once admitted) or "published" (answer once on the stream).
func syncParam(r *http.Request) (published bool, err error) {
	switch v := r.URL.Query().Get("sync"); v {
	case "":
		return false, nil
	case "published":
		return true, nil
	default:
		return false, apiErr(http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("sync=%q: the only value is \"published\"", v))
	}
}

// awaitPublished is the write barrier of ?sync=published: it returns once the
// pool's hub (the mirror every stream reads) carries everything admitted
// before the call. The actor's mailbox is FIFO, so a Flush queued after the
// admissions publishes their tail, and the Stats after it names the lease
// and sequence that cover them; the barrier then waits, without polling, for
// the hub to reach that point. If the publisher had no healthy lease (the
// hub's lease stalled, or the hub is resubscribing) it waits for the hub's
// next snapshot and asks again. done is the request's held success body,
// quoted by the 504 and 503 (they say what was admitted: do not resend it).
func (s *Server) awaitPublished(ctx context.Context, p *hostedPool, done []byte) error {
	ctx, cancel := context.WithTimeout(ctx, SyncPublishedTimeout)
	defer cancel()
	var counts struct{ Admitted *int }
	_ = json.Unmarshal(done, &counts)
	fail := func(status int, code, why string) error {
		ae := apiErr(status, code, fmt.Sprintf("the request succeeded (%s; do not resend it) but %s",
			bytes.TrimSpace(done), why))
		ae.admitted = counts.Admitted
		return ae
	}
	timeout := func(why string) error {
		if errors.Is(ctx.Err(), context.Canceled) {
			return ctx.Err() // the client went away: nobody reads the answer
		}
		return fail(http.StatusGatewayTimeout, CodePublishTimeout, fmt.Sprintf("%s within %v", why, SyncPublishedTimeout))
	}
	g := p.gen()
ask:
	for {
		ferr := g.handle.Flush(ctx)
		st, err := g.handle.Stats(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return timeout("the pool's actor did not publish it")
			}
			return err
		}
		healthy := ferr == nil && st.HasLease && st.Fence == producer.NotFenced
		pos, changed := g.hub.Watch()
		for {
			if healthy && pos.Covers(st.Lease.AssignmentEpoch, st.Sequence) {
				return nil
			}
			if pos.Closed {
				return fail(http.StatusServiceUnavailable, CodeShuttingDown, "the pool's stream closed before it was on it")
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return timeout(fmt.Sprintf("the pool's stream is at %d, not yet at %d", pos.Sequence, st.Sequence))
			}
			if !healthy {
				continue ask // the hub changed (a new snapshot?): ask the actor again
			}
			pos, changed = g.hub.Watch()
		}
	}
}
