package demo

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/server"
	"github.com/ckfrelay/ckfrelay/wire"
)

// dcFeed is how one data center's engine events reach its relay pool: the
// demo's one seam for event transports. The fleet simulation hands every
// request's events to its data center's feed; the feed may shape the pool's
// spec before the relay starts (a feed the relay subscribes to, such as an
// engine's ZMQ publisher, adds its server.SourceSpec there) and is opened
// once the relay listens. A feed is used by one goroutine.
type dcFeed interface {
	// Configure adjusts data center d's pool spec before the relay starts.
	Configure(d int, spec *server.PoolSpec)
	// Open starts the feed against the relay at base (http://host:port).
	Open(ctx context.Context, base string) error
	// Send delivers the events one served request emitted, in order. It
	// returns when the relay admitted them (or, for a transport without an
	// acknowledgement, when they were handed to it).
	Send(ctx context.Context, s *servedRequest) error
	// Close releases the feed.
	Close() error
}

// servedRequest is what serving one request on a rank emitted: the events,
// and the request's trace block ids and local hashes (a feed that speaks an
// engine's wire format sends token ids, not hashes).
type servedRequest struct {
	rank        int // fleet rank index within the data center
	ids, locals []uint64
	evs         []ckf.RouterEvent
}

// newFeeds returns one feed per data center: data center zmqDemoDC hears its
// engines over ZMQ as production does (demo_zmq.go), every other one posts
// its events to the relay's HTTP API.
func newFeeds(o demoOptions, stdout io.Writer) ([]dcFeed, error) {
	feeds := make([]dcFeed, o.dataCenters)
	httpc := &http.Client{Timeout: 10 * time.Second}
	for d := range feeds {
		if d == zmqDemoDC {
			z, err := newZMQDemo(o, stdout)
			if err != nil {
				closeFeeds(feeds[:d])
				return nil, err
			}
			feeds[d] = z
			continue
		}
		feeds[d] = &httpFeed{client: httpc}
	}
	return feeds, nil
}

// openFeeds opens every feed against the relay at base.
func openFeeds(ctx context.Context, feeds []dcFeed, base string) error {
	for d, f := range feeds {
		if err := f.Open(ctx, base); err != nil {
			return fmt.Errorf("dc %d feed: %w", d, err)
		}
	}
	return nil
}

// closeFeeds closes every feed.
func closeFeeds(feeds []dcFeed) {
	for _, f := range feeds {
		_ = f.Close()
	}
}

// httpFeed posts a data center's events, as JSON, to its pool's events
// endpoint (source epoch 1) and requires 202 Accepted.
type httpFeed struct {
	client *http.Client
	url    string
	body   []byte // reused encoding buffer
}

func (f *httpFeed) Configure(d int, _ *server.PoolSpec) {
	f.url = "/v1/pools/" + poolName(d) + "/events?source_epoch=1"
}

func (f *httpFeed) Open(_ context.Context, base string) error {
	f.url = base + f.url
	return nil
}

func (f *httpFeed) Send(ctx context.Context, s *servedRequest) error {
	var err error
	if f.body, err = wire.AppendRouterEventsJSON(f.body[:0], s.evs); err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.url, bytes.NewReader(f.body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := f.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("relay refused events: %s %s", resp.Status, b)
	}
	return nil
}

func (f *httpFeed) Close() error { return nil }
