package tail

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/internal/catalog"
	"github.com/ckfrelay/ckfrelay/wire/cbi1"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

// grpcOpts are the flags of `relay tail --grpc`.
type grpcOpts struct {
	addr *string
	sel  SelectionFlags
}

func grpcFlags(fs *flag.FlagSet) grpcOpts {
	return grpcOpts{
		addr: fs.String("grpc", "", "follow a KvEventRelay gRPC server at HOST:PORT instead of an HTTP pool stream"),
		sel:  AddSelectionFlags(fs),
	}
}

// SelectionFlags are the gRPC catalog selection flags of `relay tail
// --grpc` and `relay query --grpc`: --model, --namespace, --role, --domain.
type SelectionFlags struct {
	model, namespace, role, domain *string
}

// AddSelectionFlags registers the selection flags on fs.
func AddSelectionFlags(fs *flag.FlagSet) SelectionFlags {
	return SelectionFlags{
		model:     fs.String("model", "", "with --grpc: select the pools of model BASE[:ADAPTER], as the Go client selects"),
		namespace: fs.String("namespace", "", "with --grpc --model: the runtime namespace (default "+client.DefaultNamespace+")"),
		role:      fs.String("role", "aggregated", "with --grpc --model: the worker role, aggregated (Dynamo's) or prefill"),
		domain:    fs.String("domain", "", "with --grpc: select the pools whose cache-semantics digest is this hex (16 bytes)"),
	}
}

// runGRPC prints the relay's catalog, one line per pool with whether the
// selection follows it and why not, then the frames of every selected pool
// (at most limit each; 0: until the streams end). With no --model and no
// --domain it lists the catalog and follows nothing.
func runGRPC(ctx context.Context, o grpcOpts, token, caFile string, limit int, stdout, stderr io.Writer) error {
	sel, also, follow, err := o.sel.Selection()
	if err != nil {
		fmt.Fprintln(stderr, "tail:", err)
		return ErrUsage
	}
	conn, err := DialGRPC(*o.addr, caFile)
	if err != nil {
		return fmt.Errorf("tail: %w", err)
	}
	defer conn.Close()
	ctx = WithToken(ctx, token)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cli := kvrelaypb.NewKvEventRelayClient(conn)
	m, err := ReadCatalog(ctx, cli, "ckfrelay-tail")
	if err != nil {
		return fmt.Errorf("tail: %w", err)
	}
	pools, err := client.ExplainCatalog(m, sel, also)
	if err != nil {
		return fmt.Errorf("tail: catalog revision %d: %w", m.GetRevision(), err)
	}
	out := &lines{enc: json.NewEncoder(stdout)}
	var selected []client.CatalogPool
	for _, p := range pools {
		if !follow {
			p.Selected, p.Why = false, "no selection (--model or --domain): listing only"
		}
		if err := out.put(poolJSON(m.GetRevision(), p)); err != nil {
			return err
		}
		if p.Selected {
			selected = append(selected, p)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, len(selected))
	for i, p := range selected {
		wg.Go(func() { errs[i] = followPool(ctx, cli, p, limit, out) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// GRPCCredentials are plaintext, or with caFile TLS trusting only the CA
// certificates in that PEM file (--ca-file of a TLS gRPC relay).
func GRPCCredentials(caFile string) (credentials.TransportCredentials, error) {
	if caFile == "" {
		return insecure.NewCredentials(), nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("--ca-file: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--ca-file %s: no PEM certificate in it", caFile)
	}
	return credentials.NewTLS(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}), nil
}

// DialGRPC connects to a KvEventRelay server at addr (see GRPCCredentials),
// receiving messages up to the contract's 8 MiB.
func DialGRPC(addr, caFile string) (*grpc.ClientConn, error) {
	creds, err := GRPCCredentials(caFile)
	if err != nil {
		return nil, err
	}
	return grpc.NewClient(addr, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(kvrelay.MaxMessageBytes)))
}

// WithToken adds token (when set) as the bearer token of ctx's RPCs.
func WithToken(ctx context.Context, token string) context.Context {
	if token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// ReadCatalog returns the relay's current catalog: the first message of a
// WatchKvPoolCatalog stream, which it then closes.
func ReadCatalog(ctx context.Context, cli kvrelaypb.KvEventRelayClient, subscriber string) (*kvrelaypb.KvPoolCatalogUpdate, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req := &kvrelaypb.WatchKvPoolCatalogRequest{SubscriberId: subscriber}
	kvrelay.StampRequest(req)
	cs, err := cli.WatchKvPoolCatalog(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("WatchKvPoolCatalog: %w", err)
	}
	m, err := cs.Recv()
	if err != nil {
		return nil, fmt.Errorf("WatchKvPoolCatalog: %w (%s)", err, kvrelay.TrailerReason(cs.Trailer()))
	}
	return m, nil
}

// Selection turns the flags into the client's selection, the --domain
// filter (nil without it), and whether anything is selected (--model or
// --domain given).
func (o SelectionFlags) Selection() (client.Selection, func(*kvrelaypb.KvPoolDescriptor) bool, bool, error) {
	var sel client.Selection
	if *o.model != "" {
		sel.Model, sel.Adapter, _ = strings.Cut(*o.model, ":")
		sel.Namespace = *o.namespace
		if sel.Namespace == "" {
			sel.Namespace = client.DefaultNamespace // as the client defaults it, so messages show it
		}
		switch *o.role {
		case "aggregated":
		case "prefill":
			sel.Role = client.RolePrefill
		default:
			return sel, nil, false, fmt.Errorf("--role %q: want aggregated or prefill", *o.role)
		}
	} else if *o.namespace != "" {
		return sel, nil, false, errors.New("--namespace selects with --model")
	}
	var also func(*kvrelaypb.KvPoolDescriptor) bool
	if *o.domain != "" {
		want, err := hex.DecodeString(*o.domain)
		if err != nil || len(want) != 16 {
			return sel, nil, false, fmt.Errorf("--domain %q: want 32 hex digits (a 16-byte cache-semantics digest)", *o.domain)
		}
		also = func(d *kvrelaypb.KvPoolDescriptor) bool {
			return string(d.GetProducer().GetPoolId().GetIndexerDomain().GetCacheSemantics().GetDigest()) == string(want)
		}
	}
	return sel, also, *o.model != "" || also != nil, nil
}

// lines writes JSON lines from several goroutines.
type lines struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func (l *lines) put(v any) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.enc.Encode(v)
}

func poolJSON(rev uint64, p client.CatalogPool) map[string]any {
	d := p.Descriptor
	dom := d.GetProducer().GetPoolId().GetIndexerDomain()
	var regs []map[string]any
	for _, r := range d.GetRegistrations() {
		reg := map[string]any{"canonical_model_id": r.GetCanonicalModelId(), "aliases": r.GetAliases()}
		if b := r.GetTarget().GetBase(); b != nil {
			reg["base_model"] = b.GetBaseModel()
		}
		if l := r.GetTarget().GetLora(); l != nil {
			reg["base_model"], reg["adapter"] = l.GetBaseModel(), l.GetAdapter()
		}
		regs = append(regs, reg)
	}
	roles := make([]string, len(d.GetPoolRoles()))
	for i, r := range d.GetPoolRoles() {
		roles[i] = r.String()
	}
	ep := d.GetServingEndpoint()
	return map[string]any{"kind": "catalog_pool", "revision": catalog.U64(rev), "dc_id": catalog.U64(p.DCID),
		"cache_semantics": hex.EncodeToString(dom.GetCacheSemantics().GetDigest()),
		"routing_scope":   hex.EncodeToString(dom.GetRoutingScope().GetDigest()),
		"endpoint":        fmt.Sprintf("%s.%s.%s", ep.GetNamespace(), ep.GetComponent(), ep.GetEndpoint()),
		"roles":           roles, "registrations": regs, "producer": identityMap(p.Identity),
		"selected": p.Selected, "why": p.Why}
}

// followPool subscribes to one selected pool under its catalog key and
// prints its updates until limit, the stream's end or ctx.
func followPool(ctx context.Context, cli kvrelaypb.KvEventRelayClient, p client.CatalogPool, limit int, out *lines) error {
	req := &kvrelaypb.SubscribeKvPoolRequest{SubscriberId: "ckfrelay-tail", ExpectedProducer: p.Descriptor.GetProducer()}
	kvrelay.StampRequest(req)
	st, err := cli.SubscribeKvPool(ctx, req)
	if err != nil {
		return fmt.Errorf("tail: dc_id %d: SubscribeKvPool: %w", p.DCID, err)
	}
	var f cbi1.Frame
	for n := 0; limit == 0 || n < limit; n++ {
		u, err := st.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("tail: dc_id %d: SubscribeKvPool: %w (%s)", p.DCID, err, kvrelay.TrailerReason(st.Trailer()))
		}
		line := map[string]any{"dc_id": catalog.U64(p.DCID), "sequence": catalog.U64(u.GetSequence()),
			"base_sequence": catalog.U64(u.GetBaseSequence()), "send_ts_us": catalog.U64(u.GetSendTsUs())}
		switch u.GetKind() {
		case kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_HEARTBEAT:
			line["kind"] = "heartbeat"
		case kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_SNAPSHOT_CHUNK, kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_DELTA:
			if err := cbi1.Decode(u.GetPayload(), &f); err != nil {
				return fmt.Errorf("tail: dc_id %d: sequence %d: %w", p.DCID, u.GetSequence(), err)
			}
			if f.Kind == cbi1.KindSnapshotChunk {
				line["kind"], line["chunk_index"], line["chunk_count"] = "snapshot_chunk", f.ChunkIndex, f.ChunkCount
				line["bucket_offset"], line["words"] = catalog.U64(f.BucketOffset), hexWords(f.Words)
			} else {
				images := make([]map[string]any, len(f.Images))
				for i, im := range f.Images {
					images[i] = map[string]any{"bucket": im.Bucket, "word": fmt.Sprintf("%016x", im.Word)}
				}
				line["kind"], line["images"] = "delta", images
			}
		default:
			line["kind"] = u.GetKind().String()
		}
		if err := out.put(line); err != nil {
			return err
		}
	}
	return nil
}
