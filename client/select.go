package client

import (
	"errors"
	"fmt"
	"strings"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

// Role is the worker role whose pool a router follows ([Selection.Role]).
type Role int

const (
	// RoleAggregated follows the pool whose workers declare the AGGREGATED
	// role: Dynamo's rule (a disaggregated model gets no prefix score).
	RoleAggregated Role = iota
	// RolePrefill follows a disaggregated model's PREFILL pool, where
	// prompt KV is computed: ckfrelay's extension past Dynamo's consumer.
	RolePrefill
)

func (r Role) String() string {
	switch r {
	case RoleAggregated:
		return "aggregated"
	case RolePrefill:
		return "prefill"
	}
	return fmt.Sprintf("Role(%d)", int(r))
}

func (r Role) wire() kvrelaypb.WorkerRole {
	if r == RolePrefill {
		return kvrelaypb.WorkerRole_WORKER_ROLE_PREFILL
	}
	return kvrelaypb.WorkerRole_WORKER_ROLE_AGGREGATED
}

// DefaultNamespace is the runtime namespace a [Selection] with a model and no
// namespace selects (Dynamo's and ckfrelay's relay's default namespace).
const DefaultNamespace = "dynamo"

// Selection is what a router routes for, over gRPC: in each data center a
// target names ([Target.DCID]), the one catalog pool that serves it. As
// Dynamo's consumer selects (lib/llm/src/global_view.rs
// sole_aggregated_overlap_producer; docs/deploy.md "What the client checks"),
// a pool is selected when
//
//  1. its serving_endpoint.namespace is Namespace,
//  2. its pool_roles hold Role's worker role (AGGREGATED by default), and
//  3. one of its registrations is the model: canonical_model_id == Model
//     with a base target, or, with Adapter set, a LoRA target of base Model
//     and adapter Adapter;
//
// and exactly one pool of the data center is: two or more are ambiguous and
// none is followed ([ErrAmbiguous]).
//
// The zero Selection (no Model) follows a data center's only pool, whatever
// its namespace, roles and models: ckfrelay's shortcut for a relay that hosts
// one pool per data center. A data center with several pools then follows
// none and says to select a model.
type Selection struct {
	// Namespace is the deployment's runtime namespace. Default
	// [DefaultNamespace] when Model is set.
	Namespace string
	// Model is the base model's canonical id.
	Model string
	// Adapter, when set, selects the LoRA registration of Model with this
	// adapter instead of Model's base registration.
	Adapter string
	// Role is the worker role of the pool: [RoleAggregated] (Dynamo's) or
	// [RolePrefill] (ckfrelay's extension).
	Role Role
}

// ErrAmbiguous: more than one catalog pool of a data center matches the
// router's selection; none is followed until the catalog tells them apart.
var ErrAmbiguous = errors.New("client: grpc: more than one pool of the data center matches the selection")

// withDefaults fills Namespace for a selection with a model and checks it.
func (s Selection) withDefaults() (Selection, error) {
	if s.Role != RoleAggregated && s.Role != RolePrefill {
		return s, fmt.Errorf("client: selection role %v: want RoleAggregated or RolePrefill", s.Role)
	}
	if s.Model == "" {
		if s.Namespace != "" || s.Adapter != "" || s.Role != RoleAggregated {
			return s, errors.New("client: a selection with a namespace, adapter or role needs a model")
		}
		return s, nil
	}
	if s.Namespace == "" {
		s.Namespace = DefaultNamespace
	}
	for _, v := range []string{s.Namespace, s.Model, s.Adapter} {
		if v != strings.TrimSpace(v) {
			return s, fmt.Errorf("client: selection %q has surrounding whitespace", v)
		}
	}
	return s, nil
}

// Matches reports whether the catalog pool d is one the selection follows,
// leaving the data center and the one-match rule to the caller. The zero
// Selection matches every pool.
func (s Selection) Matches(d *kvrelaypb.KvPoolDescriptor) bool {
	if s.Model == "" {
		return true
	}
	if d.GetServingEndpoint().GetNamespace() != s.Namespace {
		return false
	}
	hasRole := false
	for _, r := range d.GetPoolRoles() {
		hasRole = hasRole || r == s.Role.wire()
	}
	if !hasRole {
		return false
	}
	for _, reg := range d.GetRegistrations() {
		if s.Adapter == "" {
			if b := reg.GetTarget().GetBase(); b != nil && reg.GetCanonicalModelId() == s.Model {
				return true
			}
			continue
		}
		if l := reg.GetTarget().GetLora(); l != nil && l.GetBaseModel() == s.Model && l.GetAdapter() == s.Adapter {
			return true
		}
	}
	return false
}

// pick returns the index in cat of the one entry of data center dc the
// selection matches. A quarantined match is returned with its error; no
// match is [ErrNotInCatalog]; several are [ErrAmbiguous].
func (s Selection) pick(cat []catalogEntry, dc uint64) (int, error) {
	return s.pickWith(cat, dc, nil)
}

// pickWith is pick with candidates narrowed further by also (nil: none).
func (s Selection) pickWith(cat []catalogEntry, dc uint64, also func(*kvrelaypb.KvPoolDescriptor) bool) (int, error) {
	found := -1
	n := 0
	for i, e := range cat {
		if e.dc != dc || !s.Matches(e.desc) || also != nil && !also(e.desc) {
			continue
		}
		n++
		found = i
	}
	switch {
	case n == 0:
		return -1, fmt.Errorf("%w: no pool of dc_id %d matches %s", ErrNotInCatalog, dc, s)
	case n > 1 && s.Model == "":
		return -1, fmt.Errorf("%w: dc_id %d has %d pools; select a model (Config.Select)", ErrAmbiguous, dc, n)
	case n > 1:
		return -1, fmt.Errorf("%w: %d pools of dc_id %d match %s", ErrAmbiguous, n, dc, s)
	case cat[found].err != nil:
		return found, cat[found].err
	}
	return found, nil
}

func (s Selection) String() string {
	if s.Model == "" {
		return "the data center's only pool"
	}
	m := s.Model
	if s.Adapter != "" {
		m += ":" + s.Adapter
	}
	return fmt.Sprintf("namespace %q, model %q, role %v", s.Namespace, m, s.Role)
}

// catalogEntry is one pool of the catalog: its descriptor (for selection),
// its key as the relay sent it (for expected_producer) and converted, or why
// it is quarantined.
type catalogEntry struct {
	desc *kvrelaypb.KvPoolDescriptor
	dc   uint64
	id   ckf.ProducerIdentity
	err  error // non-nil: quarantined
}

// parseCatalog validates a catalog update: the envelope and the snapshot
// (an entry without pool_id, or a producer key listed twice, invalidates it
// all), then each entry on its own (an entry that fails is quarantined, the
// others kept).
func parseCatalog(m *kvrelaypb.KvPoolCatalogUpdate) ([]catalogEntry, error) {
	if err := kvrelay.CheckResponse(m); err != nil {
		return nil, fmt.Errorf("client: grpc: catalog: %w", err)
	}
	if m.GetSnapshot() == nil {
		return nil, fmt.Errorf("client: grpc: catalog revision %d without a snapshot", m.GetRevision())
	}
	cat := make([]catalogEntry, 0, len(m.GetSnapshot().GetPools()))
	keys := map[ckf.ProducerIdentity]bool{}
	for i, d := range m.GetSnapshot().GetPools() {
		if d.GetProducer().GetPoolId() == nil {
			// Not identifiable: the snapshot cannot be applied safely.
			return nil, fmt.Errorf("client: grpc: catalog entry %d has no pool_id", i)
		}
		id, err := checkDescriptor(d)
		if err == nil {
			if keys[id] {
				return nil, fmt.Errorf("client: grpc: catalog lists producer %+v twice", id)
			}
			keys[id] = true
		}
		cat = append(cat, catalogEntry{desc: d, dc: d.GetProducer().GetPoolId().GetDcId(), id: id, err: err})
	}
	return cat, nil
}

// checkDescriptor converts a descriptor's producer and checks the fields a
// router depends on, as Dynamo's validate_pool_descriptor does
// (wan/grpc/protocol/wire/identity.rs): unknown values quarantine the entry
// (the contract's "unsupported entry is not permission to use default
// semantics"), and so does malformed known data — a missing serving
// endpoint, empty or padded endpoint or model text, a worker role or alias
// listed twice.
func checkDescriptor(d *kvrelaypb.KvPoolDescriptor) (ckf.ProducerIdentity, error) {
	id, err := kvrelay.ProducerFromWire(d.GetProducer())
	if err != nil {
		return id, fmt.Errorf("%w: %w", ErrQuarantined, err)
	}
	q := d.GetQuerySemantics()
	switch {
	case q == nil || q.GetKvBlockSize() == 0:
		return id, fmt.Errorf("%w: query_semantics missing or kv_block_size 0", ErrQuarantined)
	case q.GetHashFormat() != kvrelaypb.KvQueryHashFormat_KV_QUERY_HASH_FORMAT_DYNAMO_STANDARD_V1 &&
		q.GetHashFormat() != kvrelaypb.KvQueryHashFormat_KV_QUERY_HASH_FORMAT_DYNAMO_EAGLE_V1:
		return id, fmt.Errorf("%w: hash format %d", ErrQuarantined, int32(q.GetHashFormat()))
	case len(d.GetPoolRoles()) == 0:
		return id, fmt.Errorf("%w: no pool_roles", ErrQuarantined)
	}
	ep := d.GetServingEndpoint()
	if ep == nil {
		return id, fmt.Errorf("%w: malformed: serving_endpoint missing", ErrQuarantined)
	}
	for _, f := range []struct{ name, v string }{{"namespace", ep.GetNamespace()}, {"component", ep.GetComponent()}, {"endpoint", ep.GetEndpoint()}} {
		if err := checkText("serving_endpoint."+f.name, f.v); err != nil {
			return id, err
		}
	}
	roles := map[kvrelaypb.WorkerRole]bool{}
	for _, r := range d.GetPoolRoles() {
		if r <= kvrelaypb.WorkerRole_WORKER_ROLE_UNSPECIFIED || r > kvrelaypb.WorkerRole_WORKER_ROLE_LEGACY {
			return id, fmt.Errorf("%w: worker role %d", ErrQuarantined, int32(r))
		}
		if roles[r] {
			return id, fmt.Errorf("%w: malformed: pool_roles repeats %v", ErrQuarantined, r)
		}
		roles[r] = true
	}
	for _, reg := range d.GetRegistrations() {
		if err := checkRegistration(reg); err != nil {
			return id, err
		}
	}
	return id, nil
}

// checkRegistration is Dynamo's validate_model_registration: a canonical id,
// a known target with its model (and adapter) named, aliases named once.
func checkRegistration(reg *kvrelaypb.ModelRegistration) error {
	if err := checkText("canonical_model_id", reg.GetCanonicalModelId()); err != nil {
		return err
	}
	t := reg.GetTarget()
	switch {
	case t.GetBase() != nil:
		if err := checkText("base_model", t.GetBase().GetBaseModel()); err != nil {
			return err
		}
	case t.GetLora() != nil:
		if err := checkText("lora.base_model", t.GetLora().GetBaseModel()); err != nil {
			return err
		}
		if err := checkText("lora.adapter", t.GetLora().GetAdapter()); err != nil {
			return err
		}
	default:
		return fmt.Errorf("%w: registration %q without a known model target", ErrQuarantined, reg.GetCanonicalModelId())
	}
	seen := map[string]bool{}
	for _, a := range reg.GetAliases() {
		if err := checkText("alias", a); err != nil {
			return err
		}
		if seen[a] {
			return fmt.Errorf("%w: malformed: registration %q repeats alias %q", ErrQuarantined, reg.GetCanonicalModelId(), a)
		}
		seen[a] = true
	}
	return nil
}

// checkText is Dynamo's validate_text: not empty, no surrounding whitespace.
func checkText(field, v string) error {
	if v == "" || strings.TrimSpace(v) != v {
		return fmt.Errorf("%w: malformed: %s %q is empty or padded", ErrQuarantined, field, v)
	}
	return nil
}

// CatalogPool is one pool of a relay's catalog as a router sees it
// ([ExplainCatalog]).
type CatalogPool struct {
	Descriptor *kvrelaypb.KvPoolDescriptor
	DCID       uint64
	// Identity is the producer key converted (zero when it does not
	// convert).
	Identity ckf.ProducerIdentity
	// Selected: a router with the selection follows this pool in its data
	// center. Why says why not (quarantined, ambiguous, not matching), or
	// is empty.
	Selected bool
	Why      string
}

// ExplainCatalog checks a catalog update as a router does and says of every
// pool whether sel selects it in its data center, and why not: the view
// `relay tail --grpc` prints. also, when not nil, narrows the candidates
// further (a tool's own filter, e.g. a cache-semantics digest). An error is
// a catalog a router would not install at all.
func ExplainCatalog(m *kvrelaypb.KvPoolCatalogUpdate, sel Selection, also func(*kvrelaypb.KvPoolDescriptor) bool) ([]CatalogPool, error) {
	sel, err := sel.withDefaults()
	if err != nil {
		return nil, err
	}
	cat, err := parseCatalog(m)
	if err != nil {
		return nil, err
	}
	out := make([]CatalogPool, len(cat))
	for i, e := range cat {
		out[i] = CatalogPool{Descriptor: e.desc, DCID: e.dc, Identity: e.id}
		matches := sel.Matches(e.desc) && (also == nil || also(e.desc))
		j, err := sel.pickWith(cat, e.dc, also)
		switch {
		case e.err != nil:
			out[i].Why = e.err.Error()
		case !matches:
			out[i].Why = fmt.Sprintf("does not match %s", sel)
		case err != nil:
			out[i].Why = err.Error()
		case j == i:
			out[i].Selected = true
		}
	}
	return out, nil
}
