package query

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/internal/catalog"
)

// pool is one followed pool: lane i of the consumer serves pools[i].
type pool struct {
	name  string
	relay int // index in poolSet.relays
	dcID  uint64
	// semantics is how its tokens are hashed: the catalog's, with
	// --block-size overriding the block size.
	semantics catalog.QuerySemantics
	eagle     bool
}

// poolSet is what a router needs: the relays, the pools in answer order,
// and their one routing domain; over gRPC also the transport and the
// catalog selection.
type poolSet struct {
	relays []string
	pools  []pool
	domain ckf.Domain
	grpc   *client.GRPCConfig // nil: HTTP
	sel    client.Selection
}

// resolve reads each relay's catalog and checks that the pools can share
// one router (poolSet.add).
func resolve(ctx context.Context, hc *http.Client, defaultRelay string, names []string, token string, blockSize int) (*poolSet, error) {
	if len(names) > ckf.MaxLanes {
		return nil, fmt.Errorf("query: %d pools: a router follows at most %d", len(names), ckf.MaxLanes)
	}
	s := &poolSet{}
	relayIndex := map[string]int{}
	catalogs := map[int]catalog.Catalog{}
	seen := map[string]bool{}
	for _, spec := range names {
		name, url, ok := strings.Cut(spec, "@")
		if !ok {
			url = defaultRelay
		}
		url = strings.TrimRight(url, "/")
		if name == "" {
			return nil, fmt.Errorf("query: --pool %q names no pool", spec)
		}
		if err := client.CheckRelayURL(url); err != nil {
			return nil, err
		}
		if seen[name+"@"+url] {
			return nil, fmt.Errorf("query: pool %s on %s given twice", name, url)
		}
		seen[name+"@"+url] = true
		ri, ok := relayIndex[url]
		if !ok {
			ri = len(s.relays)
			relayIndex[url] = ri
			s.relays = append(s.relays, url)
			c, err := catalog.Get(ctx, hc, url, token)
			if err != nil {
				return nil, fmt.Errorf("query: %s: %w", url, err)
			}
			catalogs[ri] = c
		}
		c := catalogs[ri]
		cp := c.Pool(name)
		if cp == nil {
			return nil, fmt.Errorf("query: relay %s has no pool %q", url, name)
		}
		d, err := cp.Identity.Domain()
		if err != nil {
			return nil, fmt.Errorf("query: pool %s: %w", name, err)
		}
		p := pool{name: name, relay: ri, dcID: uint64(cp.DCID), semantics: cp.Query}
		if err := s.add(p, d, blockSize); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// add appends p, whose pool is in routing domain d, after checking that it
// can share the router with the pools before it: the same routing domain (a
// consumer holds one; formats may differ, each lane has its own), the same
// query semantics (one request is hashed once for every pool; blockSize > 0
// overrides every pool's block size), and its own data center.
func (s *poolSet) add(p pool, d ckf.Domain, blockSize int) error {
	if blockSize > 0 {
		p.semantics.BlockSize = blockSize
	}
	var err error
	if p.eagle, err = p.semantics.Eagle(); err != nil {
		return fmt.Errorf("query: pool %s: %w", p.name, err)
	}
	if len(s.pools) == 0 {
		s.domain = d
	} else if first := s.pools[0]; d != s.domain {
		return fmt.Errorf("query: pools %s and %s are in different routing domains (cache_semantics or routing_scope): one router cannot follow both", first.name, p.name)
	} else if p.semantics != first.semantics {
		return fmt.Errorf("query: pools %s and %s hash requests differently (block_size %d vs %d, hash_format %s vs %s): one request cannot be asked of both; --block-size sets one block size for every pool",
			first.name, p.name, first.semantics.BlockSize, p.semantics.BlockSize, first.semantics.HashFormat, p.semantics.HashFormat)
	}
	for _, q := range s.pools {
		if q.dcID == p.dcID {
			return fmt.Errorf("query: pools %s and %s have the same dc_id %d", q.name, p.name, p.dcID)
		}
	}
	s.pools = append(s.pools, p)
	return nil
}

// manifest is the consumer manifest of the set: lane i serves pools[i], and
// no format is pinned, so each lane takes its pool's format from its
// assignment (and follows it across a resize).
func (s *poolSet) manifest(consumerID uint64) consumer.Manifest {
	m := consumer.Manifest{ConsumerInstance: consumerID, Domain: s.domain, VerificationWindow: consumer.DefaultVerificationWindow}
	for i, p := range s.pools {
		m.Lanes[i] = &ckf.PoolID{Domain: s.domain, DCID: p.dcID}
	}
	return m
}

// config is the router's configuration for the set.
func (s *poolSet) config(token string, consumerID uint64, hc *http.Client) client.Config {
	cfg := client.Config{AuthToken: token, ConsumerInstance: consumerID, HTTPClient: hc, GRPC: s.grpc, Select: s.sel}
	for _, u := range s.relays {
		cfg.Relays = append(cfg.Relays, client.Relay{Addrs: []string{u}})
	}
	for i, p := range s.pools {
		cfg.Targets = append(cfg.Targets, client.Target{Pool: p.name, Lane: i, Relay: p.relay, DCID: p.dcID})
	}
	return cfg
}

// waitReady returns when every lane is ready, or ErrNotReady naming the
// pools that are not after wait.
func (s *poolSet) waitReady(ctx context.Context, r *client.Router, wait time.Duration) error {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		var missing []string
		for i, p := range s.pools {
			if li := r.Lane(i); !li.Ready {
				missing = append(missing, fmt.Sprintf("%s (%s)", p.name, orNone(li.LastError)))
			}
		}
		if len(missing) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("%w after %v: %s", ErrNotReady, wait, strings.Join(missing, ", "))
		case <-tick.C:
		}
	}
}

func orNone(s string) string {
	if s == "" {
		return "no error yet"
	}
	return s
}
