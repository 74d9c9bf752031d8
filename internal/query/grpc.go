package query

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/internal/catalog"
	"github.com/ckfrelay/ckfrelay/internal/tail"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

// resolveGRPC reads each KvEventRelay server's catalog and picks, in every
// data center, the pool the selection selects there (client.ExplainCatalog,
// the router's own rule): the data centers dcs names, in that order, or
// with none every data center some pool is selected in, by ascending dc_id.
// Over gRPC a pool's label is its dc_id in decimal. A data center on two
// relays is refused (one lane per pool identity), and so is a --domain that
// narrows a data center to a pool the router's selection alone would not
// follow (the router selects by Config.Select only).
func resolveGRPC(ctx context.Context, addrs []string, dcs []uint64, sf tail.SelectionFlags, token, caFile string, blockSize int) (*poolSet, error) {
	sel, also, _, err := sf.Selection()
	if err != nil {
		return nil, fmt.Errorf("query: %w", err)
	}
	creds, err := tail.GRPCCredentials(caFile)
	if err != nil {
		return nil, fmt.Errorf("query: %w", err)
	}
	s := &poolSet{relays: addrs, sel: sel, grpc: &client.GRPCConfig{DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(creds)}}}
	type found struct {
		relay int
		p     client.CatalogPool
	}
	byDC := map[uint64]found{}
	why := map[uint64][]string{}
	for ri, addr := range addrs {
		if slices.Contains(addrs[:ri], addr) {
			return nil, fmt.Errorf("query: --grpc %s given twice", addr)
		}
		pools, routed, err := explain(ctx, addr, caFile, token, sel, also)
		if err != nil {
			return nil, err
		}
		for i, p := range pools {
			if !p.Selected {
				if w := fmt.Sprintf("%s: %s", addr, p.Why); !slices.Contains(why[p.DCID], w) {
					why[p.DCID] = append(why[p.DCID], w)
				}
				continue
			}
			if !routed[i].Selected {
				return nil, fmt.Errorf("query: %s dc_id %d: --domain picks a pool a router selecting %v does not follow (%s); give a --model that selects it alone",
					addr, p.DCID, sel, routed[i].Why)
			}
			if prev, dup := byDC[p.DCID]; dup {
				return nil, fmt.Errorf("query: dc_id %d is selected on both %s and %s: one lane a data center", p.DCID, addrs[prev.relay], addr)
			}
			byDC[p.DCID] = found{ri, p}
		}
	}
	if len(dcs) == 0 {
		for dc := range byDC {
			dcs = append(dcs, dc)
		}
		slices.Sort(dcs)
		if len(dcs) == 0 {
			return nil, fmt.Errorf("query: no pool selected (%v) in any data center of %s", sel, strings.Join(addrs, ", "))
		}
	}
	if len(dcs) > ckf.MaxLanes {
		return nil, fmt.Errorf("query: %d data centers: a router follows at most %d (name them with --dc)", len(dcs), ckf.MaxLanes)
	}
	for _, dc := range dcs {
		f, ok := byDC[dc]
		if !ok {
			reason := "no relay's catalog has it"
			if w := why[dc]; len(w) > 0 {
				reason = strings.Join(w, "; ")
			}
			return nil, fmt.Errorf("query: --dc %d: no pool selected (%v): %s", dc, sel, reason)
		}
		q := f.p.Descriptor.GetQuerySemantics()
		sem := catalog.QuerySemantics{BlockSize: int(q.GetKvBlockSize()), HashFormat: catalog.HashFormatStandard}
		if q.GetHashFormat() == kvrelaypb.KvQueryHashFormat_KV_QUERY_HASH_FORMAT_DYNAMO_EAGLE_V1 {
			sem.HashFormat = catalog.HashFormatEagle
		}
		p := pool{name: strconv.FormatUint(dc, 10), relay: f.relay, dcID: dc, semantics: sem}
		if err := s.add(p, f.p.Identity.Pool.Domain, blockSize); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// explain reads the catalog of the relay at addr and says of each pool
// whether the selection with the --domain filter selects it (pools), and
// whether the selection alone does, as the router decides (routed).
func explain(ctx context.Context, addr, caFile, token string, sel client.Selection, also func(*kvrelaypb.KvPoolDescriptor) bool) (pools, routed []client.CatalogPool, err error) {
	conn, err := tail.DialGRPC(addr, caFile)
	if err != nil {
		return nil, nil, fmt.Errorf("query: %s: %w", addr, err)
	}
	defer conn.Close()
	m, err := tail.ReadCatalog(tail.WithToken(ctx, token), kvrelaypb.NewKvEventRelayClient(conn), "ckfrelay-query")
	if err != nil {
		return nil, nil, fmt.Errorf("query: %s: %w", addr, err)
	}
	if pools, err = client.ExplainCatalog(m, sel, also); err != nil {
		return nil, nil, fmt.Errorf("query: %s: catalog revision %d: %w", addr, m.GetRevision(), err)
	}
	routed = pools
	if also != nil {
		if routed, err = client.ExplainCatalog(m, sel, nil); err != nil {
			return nil, nil, fmt.Errorf("query: %s: catalog revision %d: %w", addr, m.GetRevision(), err)
		}
	}
	return pools, routed, nil
}
