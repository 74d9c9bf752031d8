package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
)

// ErrNoCatalog: [Config.Manifest] has no catalog to read the pools'
// identities from (a NATS router reads the broadcast, not a relay).
var ErrNoCatalog = errors.New("client: no relay catalog to build the manifest from")

// Manifest returns the consumer manifest a router with this Config needs,
// built from the relays' catalogs (SPEC §8.2, manifest version 2): lane
// t.Lane of each target serves the pool the target names (over HTTP, the
// catalog's pool of that name; over gRPC, the pool Select picks in data
// center t.DCID), in the routing domain the pools share; each lane takes
// its format from its assignment, so it follows its pool across a resize
// and pools of different sizes share one consumer, unless the target pins
// one (Target.Format). The window is Config.VerificationWindow. Build the
// consumer from it ([NewNative], or a wasm/host instance) and the router
// from the same Config, so a router never hand-builds a manifest.
//
// It reads each relay's catalog once (its replicas in order until one
// answers) and fails, changing nothing, when a relay answers none, a pool
// is not in its catalog, the pools are in different routing domains or
// share a dc_id, or the Config is invalid ([New]'s checks); over NATS it
// returns [ErrNoCatalog].
func (cfg Config) Manifest(ctx context.Context) (consumer.Manifest, error) {
	r, err := New(cfg, nil) // New's checks and defaults; it dials nothing
	if err != nil {
		return consumer.Manifest{}, err
	}
	defer func() {
		for _, g := range r.grpc {
			g.close()
		}
	}()
	cfg = r.cfg
	var ids [ckf.MaxLanes]ckf.PoolID
	switch {
	case r.nats != nil:
		return consumer.Manifest{}, fmt.Errorf("%w: over NATS, build the consumer.Manifest from the relays' catalogs (each pool's domain and dc_id, no format pinned)", ErrNoCatalog)
	case r.grpc != nil:
		cats := map[int][]catalogEntry{}
		for _, t := range cfg.Targets {
			cat, ok := cats[t.Relay]
			if !ok {
				if cat, err = r.grpc[t.Relay].firstCatalog(ctx); err != nil {
					return consumer.Manifest{}, fmt.Errorf("client: manifest: relay %d: %w", t.Relay, err)
				}
				cats[t.Relay] = cat
			}
			i, err := cfg.Select.pick(cat, t.DCID)
			if err != nil {
				return consumer.Manifest{}, fmt.Errorf("client: manifest: target %s (dc_id %d): %w", t.Pool, t.DCID, err)
			}
			ids[t.Lane] = cat[i].id.Pool
		}
	default:
		cats := map[int]*relayCatalog{}
		for _, t := range cfg.Targets {
			c, ok := cats[t.Relay]
			if !ok {
				if c, err = r.httpCatalog(ctx, t.Relay); err != nil {
					return consumer.Manifest{}, err
				}
				cats[t.Relay] = c
			}
			id, err := c.pool(t.Pool)
			if err != nil {
				return consumer.Manifest{}, fmt.Errorf("client: manifest: relay %d: %w", t.Relay, err)
			}
			ids[t.Lane] = id
		}
	}
	m := consumer.Manifest{ConsumerInstance: cfg.ConsumerInstance, Domain: ids[cfg.Targets[0].Lane].Domain, VerificationWindow: cfg.VerificationWindow}
	for _, t := range cfg.Targets {
		id := ids[t.Lane]
		m.Lanes[t.Lane] = &id
		m.LaneFormats[t.Lane] = t.Format
	}
	if err := m.Validate(); err != nil {
		return consumer.Manifest{}, fmt.Errorf("client: manifest: %w", err)
	}
	return m, nil
}

// MaxCatalogBytes bounds a relay catalog [Config.Manifest] reads over HTTP
// (a catalog of every pool's identity and statistics is a few KiB a pool).
const MaxCatalogBytes = 16 << 20

// relayCatalog is what a manifest needs of a relay's GET /v1/pools body
// (README "Pool catalog"): each pool's name, dc_id and routing domain.
type relayCatalog struct {
	Pools []struct {
		Name     string `json:"name"`
		DCID     uint64 `json:"dc_id,string"`
		Identity struct {
			CacheSemantics    string `json:"cache_semantics"`
			CacheSemanticsSrc string `json:"cache_semantics_source"`
			RoutingScope      string `json:"routing_scope"`
			RoutingScopeSrc   string `json:"routing_scope_source"`
		} `json:"identity"`
	} `json:"pools"`
}

// pool returns the named pool's identity.
func (c *relayCatalog) pool(name string) (ckf.PoolID, error) {
	for _, p := range c.Pools {
		if p.Name != name {
			continue
		}
		sem, err := ckf.ParseScopedDigest(p.Identity.CacheSemantics, p.Identity.CacheSemanticsSrc)
		if err != nil {
			return ckf.PoolID{}, fmt.Errorf("pool %s: cache_semantics: %w", name, err)
		}
		scope, err := ckf.ParseScopedDigest(p.Identity.RoutingScope, p.Identity.RoutingScopeSrc)
		if err != nil {
			return ckf.PoolID{}, fmt.Errorf("pool %s: routing_scope: %w", name, err)
		}
		return ckf.PoolID{Domain: ckf.Domain{CacheSemantics: sem, RoutingScope: scope}, DCID: p.DCID}, nil
	}
	return ckf.PoolID{}, fmt.Errorf("%w: no pool %q", ErrNotInCatalog, name)
}

// httpCatalog reads relay ri's catalog from its replicas, the one in use
// first.
func (r *Router) httpCatalog(ctx context.Context, ri int) (*relayCatalog, error) {
	rs := r.http[ri]
	_, start := rs.current()
	var errs []error
	for k := range rs.addrs {
		addr := rs.addrs[(start+k)%len(rs.addrs)]
		c, err := r.getCatalog(ctx, addr)
		if err == nil {
			return c, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
	}
	return nil, fmt.Errorf("client: manifest: relay %d: no replica served its catalog: %w", ri, errors.Join(errs...))
}

// getCatalog reads the catalog of the relay at base.
func (r *Router) getCatalog(ctx context.Context, base string) (*relayCatalog, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/v1/pools", nil)
	if err != nil {
		return nil, err
	}
	if r.cfg.AuthToken != "" {
		req.Header.Set("Authorization", "Bearer "+r.cfg.AuthToken)
	}
	resp, err := r.cfg.HTTPClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return nil, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	var c relayCatalog
	body := &io.LimitedReader{R: resp.Body, N: MaxCatalogBytes + 1}
	if err := json.NewDecoder(body).Decode(&c); err != nil {
		if body.N == 0 {
			return nil, fmt.Errorf("catalog: longer than %d bytes", MaxCatalogBytes)
		}
		return nil, fmt.Errorf("catalog: %w", err)
	}
	return &c, nil
}

// firstCatalog reads one valid catalog snapshot from the relay's replicas,
// the one in use first.
func (t *grpcTransport) firstCatalog(ctx context.Context) ([]catalogEntry, error) {
	var errs []error
	for range t.addrs.addrs {
		_, at := t.addrs.current()
		cat, err := t.catalogOnce(ctx)
		if err == nil {
			return cat, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
		t.addrs.failed(at)
	}
	return nil, errors.Join(errs...)
}

// catalogOnce runs one catalog stream until its first install.
func (t *grpcTransport) catalogOnce(ctx context.Context) ([]catalogEntry, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	t.mu.Lock()
	changed := t.changed
	t.mu.Unlock()
	ended := make(chan error, 1)
	go func() {
		_, err := t.watchOnce(wctx)
		ended <- err
	}()
	select {
	case <-changed:
	case err := <-ended:
		return nil, err
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	cancel()
	<-ended
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.catErr != nil {
		return nil, t.catErr
	}
	return t.catalog, nil
}

// FormatMismatchError is why a router stopped following a lane for good
// ([LaneInfo.Stopped]): the pool serves a format the consumer's manifest
// does not allow the lane (a pinned Target.Format, or a version-1 manifest's
// one format, that the pool's size no longer matches after a resize).
// Retrying cannot help until the configuration changes, so the router does
// not retry; the other lanes go on. It matches consumer.ErrFormatMismatch.
// An invalid format from the relay is not one: it ends the session like any
// protocol fault and the lane resubscribes.
type FormatMismatchError struct {
	Lane   int
	Format ckf.Format // the pool's, from its snapshot's identity
	Err    error      // the consumer's refusal
}

func (e *FormatMismatchError) Error() string {
	return fmt.Sprintf("client: lane %d: the pool serves format (seed %#x, %d buckets), which the consumer's manifest does not allow (%v); pin no format (Config.Manifest) to follow the pool's size",
		e.Lane, e.Format.Seed, e.Format.BucketCount, e.Err)
}

func (e *FormatMismatchError) Unwrap() error { return e.Err }
