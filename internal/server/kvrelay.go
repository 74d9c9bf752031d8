package server

import (
	"context"
	"strings"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/hub"
	"github.com/ckfrelay/ckfrelay/internal/source"
	"github.com/ckfrelay/ckfrelay/producer"
)

// This file is the server's side of the dynamo.kvrelay.v1 gRPC adapter
// (package internal/grpcserver): its configuration and the read-only view of
// the hosted pools the adapter serves from. The adapter holds no state of
// its own: filter streams subscribe to the same hub (and so the same
// publisher lease) as the HTTP stream.

// GRPCConfig configures the dynamo.kvrelay.v1.KvEventRelay listener
// (docs/deploy.md). It is off while Listen is empty. TLS and the bearer
// token of [Config] apply to it as to HTTP.
type GRPCConfig struct {
	// Listen is the gRPC listen address, e.g. "127.0.0.1:7879".
	Listen string `json:"listen,omitempty"`
	// MaxStreams bounds the concurrent streams of each streaming RPC
	// separately (catalog, pool, readiness, pool load, serving load);
	// beyond it a stream is refused RESOURCE_LIMIT. Subscriptions to one
	// pool's filter are further bounded by max_subscribers, shared with
	// HTTP streams. Default 256.
	MaxStreams int `json:"max_streams,omitempty"`
	// LoadInterval is the cadence of pool-load and serving-load windows,
	// and of catalog change checks. Default 1s.
	LoadInterval Duration `json:"load_interval,omitempty"`
	// InstanceID is RelayIdentity.drt_instance_id. Default: XXH3-64 of the
	// host name and the gRPC listen address, stable across restarts
	// (relay_incarnation, the start time, tells restarts apart).
	InstanceID uint64 `json:"instance_id,omitempty"`
	// MaxConnections bounds the listener's open connections; a connection
	// beyond it is closed at once (and counted), so idle or half-open peers
	// cannot exhaust the relay's descriptors. Default 1024.
	MaxConnections int `json:"max_connections,omitempty"`
	// HandshakeTimeout bounds a connection's TLS and HTTP/2 handshake;
	// IdleTimeout closes a connection that has had no RPC for that long.
	// Defaults 5s and 2m.
	HandshakeTimeout Duration `json:"handshake_timeout,omitempty"`
	IdleTimeout      Duration `json:"idle_timeout,omitempty"`
	// MaxStreamsPerConnection is the HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS
	// the listener advertises: a client queues further streams, a peer that
	// opens one anyway gets RST_STREAM(REFUSED_STREAM). Default 100.
	MaxStreamsPerConnection int `json:"max_streams_per_connection,omitempty"`
	// MaxPendingStreams bounds the streams whose request has not arrived
	// (all connections together); at the bound the longest-pending one is
	// cancelled. Default 1024.
	MaxPendingStreams int `json:"max_pending_streams,omitempty"`
	// FirstRequestTimeout cancels a stream whose request has not arrived
	// this long after its HEADERS, and closes a connection that has had no
	// admitted call (with auth_token: no authenticated one) this long after
	// it was accepted. Default 10s.
	FirstRequestTimeout Duration `json:"first_request_timeout,omitempty"`
	// MaxIdlePerClient bounds the idle connections (no admitted call in
	// progress) of one client address; past it the address's longest-idle
	// one is closed. Default 64.
	MaxIdlePerClient int `json:"max_idle_per_client,omitempty"`
	// MaxConnectionsPerClient bounds the connections, busy or idle, of one
	// client address: past it the address's longest-idle one is closed, or
	// the new one when all are busy, so one address cannot hold every
	// connection with admitted streams. Default 256.
	MaxConnectionsPerClient int `json:"max_connections_per_client,omitempty"`
}

// Defaults of GRPCConfig.
const (
	DefaultGRPCMaxStreams   = 256
	DefaultGRPCLoadInterval = time.Second
	DefaultGRPCMaxConns     = 1024
	DefaultGRPCHandshake    = 5 * time.Second
	DefaultGRPCIdle         = 2 * time.Minute
	DefaultGRPCConnStreams  = 100
	DefaultGRPCPending      = 1024
	DefaultGRPCFirstRequest = 10 * time.Second
	DefaultGRPCIdlePerAddr  = 64
	DefaultGRPCConnsPerAddr = 256
)

// KvPoolSpec is a pool's descriptive metadata in the gRPC catalog
// (KvPoolDescriptor): none of it takes part in the producer identity. Every
// field is optional; the defaults are documented per field.
type KvPoolSpec struct {
	// Namespace, Component and Endpoint name the Dynamo endpoint serving
	// the pool (KvPoolDescriptor.serving_endpoint). Defaults "dynamo",
	// "backend", "generate".
	Namespace string `json:"namespace,omitempty"`
	Component string `json:"component,omitempty"`
	Endpoint  string `json:"endpoint,omitempty"`
	// Models are the pool's model registrations. Default none.
	Models []ModelSpec `json:"models,omitempty"`
	// Roles are the worker roles the pool's workers declare: "prefill",
	// "decode", "encode", "aggregated" or "legacy" (no declared role).
	// Default ["legacy"].
	Roles []string `json:"roles,omitempty"`
	// TotalKVBlocks is the pool's KV capacity in blocks over all ranks
	// (KvPoolLoadEntry.total_kv_blocks). Default 0: unknown.
	TotalKVBlocks uint64 `json:"total_kv_blocks,omitempty"`
	// ExpectedRanks is how many worker ranks the pool has
	// (KvPoolLoadEntry.kv_expected_ranks). Default: the ranks its sources
	// declare (dp_ranks of each ZMQ source), else the ranks that hold
	// blocks.
	ExpectedRanks uint32 `json:"expected_ranks,omitempty"`
}

// ModelSpec is one model registration of a pool.
type ModelSpec struct {
	// ID is the canonical model id.
	ID string `json:"id"`
	// LoraAdapter, when set, makes this a LoRA registration of BaseModel
	// with this adapter; else it is a base-model registration.
	LoraAdapter string `json:"lora_adapter,omitempty"`
	// BaseModel is the base model. Default: ID.
	BaseModel string `json:"base_model,omitempty"`
	// Aliases are further names of the model.
	Aliases []string `json:"aliases,omitempty"`
}

// Defaults of KvPoolSpec.
const (
	DefaultKvBlockSize  = 16 // KvQuerySemantics.kv_block_size of a pool that declares none
	DefaultNamespace    = "dynamo"
	DefaultComponent    = "backend"
	DefaultEndpoint     = "generate"
	DefaultRole         = "legacy"
	maxKvPoolModels     = 1024
	maxKvPoolNameLength = 256
)

// WorkerRoles are the role names a pool's roles may use, in the contract's
// enum order (WORKER_ROLE_PREFILL = 1 …).
var WorkerRoles = []string{"prefill", "decode", "encode", "aggregated", "legacy"}

func (c *GRPCConfig) withDefaults() {
	setDefault(&c.MaxStreams, DefaultGRPCMaxStreams)
	setDefault(&c.LoadInterval, Duration(DefaultGRPCLoadInterval))
	setDefault(&c.MaxConnections, DefaultGRPCMaxConns)
	setDefault(&c.HandshakeTimeout, Duration(DefaultGRPCHandshake))
	setDefault(&c.IdleTimeout, Duration(DefaultGRPCIdle))
	setDefault(&c.MaxStreamsPerConnection, DefaultGRPCConnStreams)
	setDefault(&c.MaxPendingStreams, DefaultGRPCPending)
	setDefault(&c.FirstRequestTimeout, Duration(DefaultGRPCFirstRequest))
	setDefault(&c.MaxIdlePerClient, DefaultGRPCIdlePerAddr)
	setDefault(&c.MaxConnectionsPerClient, DefaultGRPCConnsPerAddr)
}

func (c GRPCConfig) validate() error {
	if c.MaxStreams < 1 {
		return invalid("grpc.max_streams must be ≥ 1")
	}
	if c.LoadInterval < Duration(10*time.Millisecond) {
		return invalid("grpc.load_interval %v < 10ms", time.Duration(c.LoadInterval))
	}
	if c.MaxConnections < 1 || c.HandshakeTimeout <= 0 || c.IdleTimeout <= 0 {
		return invalid("grpc.max_connections must be ≥ 1, grpc.handshake_timeout and grpc.idle_timeout > 0")
	}
	if c.MaxStreamsPerConnection < 1 || c.MaxPendingStreams < 1 || c.MaxIdlePerClient < 1 || c.MaxConnectionsPerClient < 1 || c.FirstRequestTimeout <= 0 {
		return invalid("grpc.max_streams_per_connection, grpc.max_pending_streams, grpc.max_idle_per_client and grpc.max_connections_per_client must be ≥ 1, grpc.first_request_timeout > 0")
	}
	return nil
}

func (k *KvPoolSpec) withDefaults() {
	setDefault(&k.Namespace, DefaultNamespace)
	setDefault(&k.Component, DefaultComponent)
	setDefault(&k.Endpoint, DefaultEndpoint)
	if len(k.Roles) == 0 {
		k.Roles = []string{DefaultRole}
	}
	models := make([]ModelSpec, len(k.Models))
	for i, m := range k.Models {
		setDefault(&m.BaseModel, m.ID)
		models[i] = m
	}
	k.Models = models
}

func (k KvPoolSpec) validate(pool string) error {
	for _, s := range []string{k.Namespace, k.Component, k.Endpoint} {
		if len(s) > maxKvPoolNameLength {
			return invalid("pool %q: kvrelay namespace, component and endpoint are at most %d bytes", pool, maxKvPoolNameLength)
		}
	}
	if len(k.Models) > maxKvPoolModels {
		return invalid("pool %q: kvrelay.models: %d, at most %d", pool, len(k.Models), maxKvPoolModels)
	}
	ids := map[string]bool{}
	for _, m := range k.Models {
		if m.ID == "" || len(m.ID) > maxKvPoolNameLength || len(m.BaseModel) > maxKvPoolNameLength || len(m.LoraAdapter) > maxKvPoolNameLength {
			return invalid("pool %q: kvrelay.models: id must be 1..%d bytes (base_model, lora_adapter at most as long)", pool, maxKvPoolNameLength)
		}
		if ids[m.ID] {
			return invalid("pool %q: kvrelay.models: duplicate id %q", pool, m.ID)
		}
		ids[m.ID] = true
		aliases := map[string]bool{}
		for _, a := range m.Aliases {
			if aliases[a] {
				return invalid("pool %q: kvrelay.models %q: alias %q listed twice (Dynamo's routers refuse the pool)", pool, m.ID, a)
			}
			aliases[a] = true
		}
	}
	// Dynamo's routers treat empty or padded endpoint and model text as a
	// malformed descriptor (validate_text, wan/grpc/protocol/wire/identity.rs):
	// never publish one.
	texts := []string{k.Namespace, k.Component, k.Endpoint}
	for _, m := range k.Models {
		texts = append(texts, m.ID, m.BaseModel)
		texts = append(texts, m.Aliases...)
		if m.LoraAdapter != "" {
			texts = append(texts, m.LoraAdapter)
		}
	}
	for _, v := range texts {
		if v == "" || strings.TrimSpace(v) != v {
			return invalid("pool %q: kvrelay: %q is empty or has surrounding whitespace", pool, v)
		}
	}
	roles := map[string]bool{}
	for _, r := range k.Roles {
		ok := false
		for _, known := range WorkerRoles {
			ok = ok || r == known
		}
		if !ok {
			return invalid("pool %q: kvrelay.roles: unknown role %q (want one of %v)", pool, r, WorkerRoles)
		}
		if roles[r] {
			return invalid("pool %q: kvrelay.roles: duplicate role %q", pool, r)
		}
		roles[r] = true
	}
	return nil
}

// Errors a pool's hub is closed with (the causes its subscriptions end with
// besides the hub's own): the pool shut down, or its producer was fenced.
var (
	ErrPoolShuttingDown = errShuttingDown
	ErrPoolFenced       = errFenced
)

// KvPool is a read-only view of one hosted pool for the gRPC adapter.
type KvPool struct {
	p *hostedPool
	s *Server
}

// KvPools returns the hosted pools in configuration order.
func (s *Server) KvPools() []KvPool {
	out := make([]KvPool, len(s.order))
	for i, p := range s.order {
		out[i] = KvPool{p: p, s: s}
	}
	return out
}

// Incarnation is the relay's incarnation: its start time in Unix
// nanoseconds, also every pool's producer incarnation.
func (s *Server) Incarnation() uint64 { return s.incarnation }

// Spec returns the pool's defaulted configuration.
func (k KvPool) Spec() PoolSpec { return k.p.spec }

// Identity returns the pool's current producer identity.
func (k KvPool) Identity() ckf.ProducerIdentity { return k.p.actor().Identity() }

// Hub returns the pool's hub: the fan-out of its one publisher lease that
// HTTP streams subscribe to as well.
func (k KvPool) Hub() *hub.Hub { return k.p.mirror() }

// Stats returns the pool's actor statistics (the exact state's counts).
func (k KvPool) Stats(ctx context.Context) (producer.ActorStats, error) {
	return k.p.actor().Stats(ctx)
}

// Sources returns the status of the pool's engine sources.
func (k KvPool) Sources() []source.Status { return k.s.SourceStatuses(k.p.spec.Name) }
