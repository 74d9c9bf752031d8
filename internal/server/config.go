// Package server is the relay's network side (SPEC §11): it hosts pools (one
// producer actor, publisher lease and hub each), accepts KV events and rank
// recovery commands over HTTP, serves each pool's frame stream to remote
// consumers, and exposes a catalog, health and Prometheus metrics.
package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/catalog"
	"github.com/ckfrelay/ckfrelay/internal/hub"
	"github.com/zeebo/xxh3"
)

// ErrInvalidConfig is wrapped by every configuration error.
var ErrInvalidConfig = errors.New("server: invalid config")

// PoolSpec configures one hosted pool (one data center). JSON names are the
// config file's keys.
type PoolSpec struct {
	// Name is the pool's URL name: [a-z0-9_-]{1,64}.
	Name string `json:"name"`
	// DCID is the data-center id carried in the pool identity.
	DCID uint64 `json:"dc_id"`
	// ExpectedBlocks sizes the filter (≈80% design load). Default 1,048,576.
	ExpectedBlocks uint64 `json:"expected_blocks,omitempty"`
	// Seed keys addressing and relocation. Default ckf.DefaultSeed.
	Seed *uint64 `json:"seed,omitempty"`
	// PublishEveryNEvents is the publication cadence. Default 16.
	PublishEveryNEvents uint64 `json:"publish_every_n_events,omitempty"`
	// PublicationDelay publishes a sparse tail after this long. Default 1ms.
	PublicationDelay Duration `json:"publication_delay,omitempty"`
	// MaxKicks bounds a relocation chain. Default 500.
	MaxKicks int `json:"max_kicks,omitempty"`
	// MaxMembers bounds the worker ranks holding blocks (SPEC §4.6): a
	// Stored event from one more is refused and counted as a Resource
	// fault. Default ckf.DefaultMaxMembers (16,384).
	MaxMembers int `json:"max_members,omitempty"`
	// MaxTrackedBlocks bounds the blocks held over all ranks, resident or
	// not (SPEC §4.6). Default 4 × the filter's slots (16 × bucket_count;
	// 8,388,608 at the default expected_blocks).
	MaxTrackedBlocks uint64 `json:"max_tracked_blocks,omitempty"`
	// ApplyWorkers is how many goroutines apply an engine batch to the
	// pool's exact state (ckf.Config.ApplyWorkers: the result is the
	// sequential apply's, word for word), 1..=64. Default (0):
	// ckf.DefaultApplyWorkers, GOMAXPROCS capped at 4 (docs/RATIONALE.md
	// "Why is apply_workers GOMAXPROCS by default?"); 1 applies on the
	// pool's actor alone.
	ApplyWorkers int `json:"apply_workers,omitempty"`
	// BlockSize is the KV block size in tokens the pool's block keys are
	// hashed with, published in the catalog's query_semantics so routers
	// hash queries alike. Its ZMQ sources' block_size defaults to it and
	// must equal it. Default: the block_size of its ZMQ sources when they
	// all name the same one, else 0 (not declared; each source names its
	// own, and the gRPC catalog says DefaultKvBlockSize).
	BlockSize int `json:"block_size,omitempty"`
	// HashFormat is the pool's token-to-block-key pipeline, Dynamo's
	// KvQueryHashFormat: "dynamo_standard_v1" (block_size-token windows, the
	// default) or "dynamo_eagle_v1" (block_size+1-token windows at a
	// block_size stride). Its ZMQ sources hash every block by it and drop
	// events of the other format (reason hash_format).
	HashFormat string `json:"hash_format,omitempty"`
	// Sources are the engines this pool hears directly (besides HTTP posts).
	Sources []SourceSpec `json:"sources,omitempty"`
	// KvRelay is the pool's metadata in the gRPC catalog (kvrelay.go).
	KvRelay KvPoolSpec `json:"kvrelay,omitzero"`
	// CacheSemantics and RoutingScope, when set, override the relay-level
	// keys of the same names for this pool: its indexer domain. A relay
	// hosts several pools of one data center (one dc_id) the way Dynamo's
	// does, one per indexer domain, e.g. one per model; two pools of one
	// data center in the same domain are a configuration error.
	CacheSemantics string `json:"cache_semantics,omitempty"`
	RoutingScope   string `json:"routing_scope,omitempty"`
}

// Hash formats of a pool (PoolSpec.HashFormat): Dynamo's KvQueryHashFormat
// names, snake_case as its serde form writes them.
const (
	HashFormatStandard = catalog.HashFormatStandard
	HashFormatEagle    = catalog.HashFormatEagle
)

// Eagle reports whether the pool hashes Eagle windows.
func (p PoolSpec) Eagle() bool { return p.HashFormat == HashFormatEagle }

// QueryBlockSize is the block size the pool's gRPC KvQuerySemantics
// declares: its block_size, or DefaultKvBlockSize when it declares none
// (the contract has no "unknown" block size).
func (p PoolSpec) QueryBlockSize() uint32 {
	if p.BlockSize > 0 {
		return uint32(p.BlockSize)
	}
	return DefaultKvBlockSize
}

// agreedBlockSize is the block_size every source that names one names, or
// 0 when none does or they differ.
func agreedBlockSize(sources []SourceSpec) int {
	seen := 0
	for _, s := range sources {
		if s.BlockSize <= 0 {
			continue
		}
		if seen != 0 && seen != s.BlockSize {
			return 0
		}
		seen = s.BlockSize
	}
	return seen
}

// SourceSpec configures one event source of a pool (docs/ingest.md). Engine
// selects the transport: "vllm", "sglang" and "trtllm" publish on ZMQ;
// "dynamo" on NATS. Fields of the other transport must be unset.
type SourceSpec struct {
	// Engine is "vllm", "sglang", "trtllm" or "dynamo".
	Engine string `json:"engine"`

	// ZMQ (vllm, sglang, trtllm). Endpoint is a PUB endpoint to connect to;
	// Bind instead binds one SUB socket that many engines connect to.
	Endpoint string `json:"endpoint,omitempty"`
	Bind     string `json:"bind,omitempty"`
	// Replay is the engine's replay (ROUTER) endpoint, used to fill gaps.
	Replay string `json:"replay,omitempty"`
	// Topic filters messages by topic prefix (default: all).
	Topic string `json:"topic,omitempty"`
	// DPRanks connects to DPRanks consecutive ports from Endpoint's (and
	// Replay's), one per data-parallel rank, as vLLM lays them out. Default 1.
	DPRanks int `json:"dp_ranks,omitempty"`
	// Worker is the worker id the engine's events are attributed to.
	Worker uint64 `json:"worker,omitempty"`
	// BlockSize is the engine's KV block size in tokens; blocks of another
	// size are dropped and counted.
	BlockSize int `json:"block_size,omitempty"`
	// SourceTimeout resets the source's ranks after this long without any
	// message (engines send an empty batch every second when idle).
	SourceTimeout Duration `json:"source_timeout,omitempty"`
	// MaxMessageBytes bounds one ZMQ message from an engine; a peer
	// announcing more is disconnected. Default: the relay's
	// max_request_bytes.
	MaxMessageBytes int64 `json:"max_message_bytes,omitempty"`
	// MaxReplayBytes bounds the bytes one replay request may return (a ZMQ
	// source); past it the gap is not filled and the rank is reset
	// degraded. Default zmq.DefaultMaxReplayBytes (64 MiB).
	MaxReplayBytes int64 `json:"max_replay_bytes,omitempty"`
	// ImageTokenID, when set, is the model's image placeholder token: a
	// multimodal block is hashed with each run of it replaced by the pad
	// value of its mm hash instead of with the mm hashes appended (Dynamo's
	// image_token_id normalisation, docs/ingest.md).
	ImageTokenID *uint32 `json:"image_token_id,omitempty"`
	// VideoTokenID, when set, is the model's video placeholder token: a
	// multimodal block is then normalised only when its image and video runs
	// map onto its mm hashes exactly, else hashed with them appended
	// (Dynamo's video_token_id normalisation, docs/ingest.md).
	VideoTokenID *uint32 `json:"video_token_id,omitempty"`
	// FailWindow is how long useless batches (all rejected or all dropped)
	// must last before the source reads "failing". Default 10s.
	FailWindow Duration `json:"fail_window,omitempty"`
	// MaxNamespaceBlocks bounds the source's cache-namespace table (block
	// hashes with a known namespace); a salted store past it is dropped
	// (namespace_limit). Default 1,048,576.
	MaxNamespaceBlocks int `json:"max_namespace_blocks,omitempty"`

	// NATS (dynamo). URL of the NATS server(s); Subject of Dynamo's KV
	// events; Stream and Durable select a JetStream durable consumer
	// instead of a core-NATS subscription.
	URL     string `json:"url,omitempty"`
	Subject string `json:"subject,omitempty"`
	Stream  string `json:"stream,omitempty"`
	Durable string `json:"durable,omitempty"`
}

// Config is the whole relay configuration.
type Config struct {
	// Listen is the HTTP listen address. Default "127.0.0.1:7878".
	Listen string `json:"listen,omitempty"`
	// TLSCertFile and TLSKeyFile enable TLS when both are set.
	TLSCertFile string `json:"tls_cert_file,omitempty"`
	TLSKeyFile  string `json:"tls_key_file,omitempty"`
	// AuthToken, when set, is required as "Authorization: Bearer <token>" on
	// every endpoint except /healthz.
	AuthToken string `json:"auth_token,omitempty"`
	// AuthTokenFile names a file holding the token (surrounding whitespace
	// trimmed), so the token appears in no process list or config file.
	// Exclusive with AuthToken; read by [Config.ResolveAuthToken].
	AuthTokenFile string `json:"auth_token_file,omitempty"`
	// DataDir, when set, keeps every pool's exact state there (a Pebble
	// database) so a relay killed without warning restarts with it.
	DataDir string `json:"data_dir,omitempty"`
	// DataDirReserveBytes is the free space the data dir's file system must
	// keep: below it the pools stop writing and go on without persistence
	// (docs/limits.md "Data directory"). 0 means persist.DefaultReserveBytes
	// (256 MiB); negative turns the check off.
	DataDirReserveBytes int64 `json:"data_dir_reserve_bytes,omitempty"`
	// CacheSemantics and RoutingScope name the routing domain; their digests
	// are XXH3-128 of the strings, marked explicit when set and
	// default-derived ("ckfrelay/default") otherwise.
	CacheSemantics string `json:"cache_semantics,omitempty"`
	RoutingScope   string `json:"routing_scope,omitempty"`
	// Limits.
	MaxFrameBytes     int   `json:"max_frame_bytes,omitempty"`      // default 8 MiB
	MaxRequestBytes   int64 `json:"max_request_bytes,omitempty"`    // default 16 MiB
	MaxEventsPerBatch int   `json:"max_events_per_batch,omitempty"` // default 4096
	MaxBlocksPerEvent int   `json:"max_blocks_per_event,omitempty"` // default 4096
	MaxSubscribers    int   `json:"max_subscribers,omitempty"`      // per pool, default 256
	// MaxSubscribersPerClient bounds the streams (HTTP and gRPC) one client
	// address holds on one pool, so one address cannot take every
	// max_subscribers slot and lock the other routers out; past it a
	// subscribe is answered 503 too_many_subscribers. Default a quarter of
	// max_subscribers (64); 1..max_subscribers.
	MaxSubscribersPerClient int `json:"max_subscribers_per_client,omitempty"`
	// MaxLeaseRecords bounds, per pool, the remembered (consumer, lane) lease
	// epochs; idle ones are forgotten beyond it. Default 65,536; ≥ max_subscribers.
	MaxLeaseRecords int `json:"max_lease_records,omitempty"`
	// MaxConcurrentIngest bounds the event, replace and reset requests
	// served at once (each may hold a body of max_request_bytes); beyond it
	// a request is answered 503 overloaded with Retry-After. Default 16.
	MaxConcurrentIngest int `json:"max_concurrent_ingest,omitempty"`
	// MaxConcurrentIngestPerClient bounds the ingest slots one client
	// address holds at once, so one address cannot hold every
	// max_concurrent_ingest slot and lock the other producers out; past it
	// a request is answered 503 overloaded with Retry-After. Default a
	// quarter of max_concurrent_ingest (4); 1..max_concurrent_ingest.
	MaxConcurrentIngestPerClient int `json:"max_concurrent_ingest_per_client,omitempty"`
	// MaxConnections bounds the open client connections (streams included).
	// At the bound a new connection closes the longest-idle keep-alive
	// connection, so health checks and fresh clients are still served; with
	// none idle it waits in the listen backlog. Default 4096.
	MaxConnections int `json:"max_connections,omitempty"`
	// MaxIdlePerClient bounds the idle keep-alive connections one client
	// address keeps: past it, its longest-idle one is closed. Default 256.
	MaxIdlePerClient int `json:"max_idle_per_client,omitempty"`
	// ReadHeaderTimeout bounds reading a request's headers. Default 10s.
	ReadHeaderTimeout Duration `json:"read_header_timeout,omitempty"`
	// BodyStartTimeout bounds the wait for an ingest request's first body
	// byte, before it takes an ingest slot: a request announcing a body it
	// does not send holds no slot, and is answered 408 after this. Default 2s.
	BodyStartTimeout Duration `json:"body_start_timeout,omitempty"`
	// BodyReadTimeout and MinBodyRate bound reading a request body: it must
	// arrive within BodyReadTimeout plus one second per MinBodyRate bytes
	// received, or the request is answered 408 and the connection closed.
	// Defaults 5s and 65,536 bytes/s.
	BodyReadTimeout Duration `json:"body_read_timeout,omitempty"`
	MinBodyRate     int64    `json:"min_body_rate,omitempty"`
	// IdleTimeout closes a keep-alive connection idle between requests for
	// this long. Default 60s.
	IdleTimeout Duration `json:"idle_timeout,omitempty"`
	// MaxSourceEpochJump bounds how far a source epoch may lie above the
	// member's current one (above 0 for a member the pool does not know):
	// farther is refused 400 epoch_out_of_range, so one bad request cannot
	// push a worker's epoch to where it can never again be announced.
	// Default 2^48.
	MaxSourceEpochJump uint64 `json:"max_source_epoch_jump,omitempty"`
	// MaxLeaseEpochLead bounds how far a stream's assignment epoch may lie
	// ahead of the relay's clock read as Unix nanoseconds (the client's
	// epochs are its clock's): farther is refused 400 epoch_out_of_range,
	// so one request cannot lock a consumer lane out. Default 5m.
	MaxLeaseEpochLead Duration `json:"max_lease_epoch_lead,omitempty"`
	// StreamStallTimeout drops a stream whose peer has not consumed any of
	// it for this long, where the kernel can tell (Linux: the peer's TCP
	// receive window stopped moving while frames were pending or sent).
	// Default 30s.
	StreamStallTimeout Duration `json:"stream_stall_timeout,omitempty"`
	// SubscriberQueue and SubscriberQueueBytes bound each pool's delta log,
	// which every subscriber shares: how far one may trail before it is
	// closed lagged. Defaults 65,536 deltas and 64 MiB.
	SubscriberQueue      int   `json:"subscriber_queue,omitempty"`
	SubscriberQueueBytes int64 `json:"subscriber_queue_bytes,omitempty"`
	// SnapshotGenerations bounds, per pool, the table copies snapshots in
	// flight share (each costs one table). Default 2.
	SnapshotGenerations int      `json:"snapshot_generations,omitempty"`
	HeartbeatInterval   Duration `json:"heartbeat_interval,omitempty"` // default 1s
	// StreamWriteTimeout bounds one write to a stream — a frame of an HTTP
	// stream, a message of a gRPC stream: a subscriber that stops reading is
	// dropped after it, so it cannot pin a handler and its subscriber slots
	// (or delay shutdown) forever. Default 10s.
	StreamWriteTimeout Duration   `json:"stream_write_timeout,omitempty"`
	ShutdownGrace      Duration   `json:"shutdown_grace,omitempty"` // default 10s
	Pools              []PoolSpec `json:"pools"`
	// NATS broadcasts every pool's frames through JetStream (server/nats.go).
	NATS NATSOut `json:"nats,omitzero"`
	// GRPC serves dynamo.kvrelay.v1.KvEventRelay (kvrelay.go).
	GRPC GRPCConfig `json:"grpc,omitzero"`
	// HA runs every pool as one replica of a group of hot standbys on NATS
	// JetStream (ha.go). Off while ha.nats_url is empty.
	HA HAConfig `json:"ha,omitzero"`
}

// Duration is a time.Duration that reads and writes as a Go duration string.
type Duration time.Duration

// UnmarshalJSON accepts "250ms"-style strings.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string like \"1ms\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes the duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// Relay defaults (SPEC §2.1 relay column, §9, §11).
const (
	DefaultListen            = "127.0.0.1:7878"
	DefaultExpectedBlocks    = 1 << 20
	DefaultPublishEveryN     = 16
	DefaultMaxFrameBytes     = 8 << 20
	DefaultMaxRequestBytes   = 16 << 20
	DefaultMaxEventsPerBatch = 4096
	DefaultMaxBlocksPerEvent = 4096
	DefaultMaxSubscribers    = 256
	DefaultSubscriberQueue   = 65536
	DefaultHeartbeat         = time.Second
	DefaultStreamWrite       = 10 * time.Second
	DefaultShutdownGrace     = 10 * time.Second
	DefaultConcurrentIngest  = 16
	DefaultMaxConnections    = 4096
	DefaultReadHeader        = 10 * time.Second
	DefaultBodyRead          = 5 * time.Second
	DefaultBodyStart         = 2 * time.Second
	DefaultMaxIdlePerClient  = 256
	DefaultMinBodyRate       = 64 << 10
	DefaultIdle              = 60 * time.Second
	DefaultSourceEpochJump   = 1 << 48
	DefaultLeaseEpochLead    = 5 * time.Minute
	DefaultStreamStall       = 30 * time.Second
)

var poolName = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`)

// WithDefaults returns c with every unset field at its default.
func (c Config) WithDefaults() Config {
	setDefault(&c.Listen, DefaultListen)
	setDefault(&c.MaxFrameBytes, DefaultMaxFrameBytes)
	setDefault(&c.MaxRequestBytes, DefaultMaxRequestBytes)
	setDefault(&c.MaxEventsPerBatch, DefaultMaxEventsPerBatch)
	setDefault(&c.MaxBlocksPerEvent, DefaultMaxBlocksPerEvent)
	setDefault(&c.MaxSubscribers, DefaultMaxSubscribers)
	setDefault(&c.MaxSubscribersPerClient, shareOf(c.MaxSubscribers))
	setDefault(&c.MaxLeaseRecords, max(hub.DefaultMaxLeaseRecords, c.MaxSubscribers))
	setDefault(&c.SubscriberQueue, DefaultSubscriberQueue)
	setDefault(&c.SubscriberQueueBytes, hub.DefaultQueueBytes)
	setDefault(&c.SnapshotGenerations, hub.DefaultSnapshotGenerations)
	setDefault(&c.HeartbeatInterval, Duration(DefaultHeartbeat))
	setDefault(&c.ShutdownGrace, Duration(DefaultShutdownGrace))
	setDefault(&c.StreamWriteTimeout, Duration(DefaultStreamWrite))
	setDefault(&c.MaxConcurrentIngest, DefaultConcurrentIngest)
	setDefault(&c.MaxConcurrentIngestPerClient, shareOf(c.MaxConcurrentIngest))
	setDefault(&c.MaxConnections, DefaultMaxConnections)
	setDefault(&c.ReadHeaderTimeout, Duration(DefaultReadHeader))
	setDefault(&c.BodyReadTimeout, Duration(DefaultBodyRead))
	setDefault(&c.BodyStartTimeout, Duration(DefaultBodyStart))
	setDefault(&c.MaxIdlePerClient, DefaultMaxIdlePerClient)
	setDefault(&c.MinBodyRate, DefaultMinBodyRate)
	setDefault(&c.IdleTimeout, Duration(DefaultIdle))
	setDefault(&c.MaxSourceEpochJump, DefaultSourceEpochJump)
	setDefault(&c.MaxLeaseEpochLead, Duration(DefaultLeaseEpochLead))
	setDefault(&c.StreamStallTimeout, Duration(DefaultStreamStall))
	c.GRPC.withDefaults()
	c.HA.withDefaults()
	if c.HA.Enabled() && c.NATS.Replicas == 0 {
		// A replicated relay's fan-out survives what its records survive.
		c.NATS.Replicas = c.HA.StreamReplicas
	}
	pools := make([]PoolSpec, len(c.Pools))
	for i, p := range c.Pools {
		setDefault(&p.ExpectedBlocks, DefaultExpectedBlocks)
		setDefault(&p.PublishEveryNEvents, DefaultPublishEveryN)
		setDefault(&p.PublicationDelay, Duration(time.Millisecond))
		setDefault(&p.MaxKicks, ckf.DefaultMaxKicks)
		setDefault(&p.ApplyWorkers, ckf.DefaultApplyWorkers())
		setDefault(&p.HashFormat, HashFormatStandard)
		sized := p.ckfConfig().WithSizedLimits() // exact-state bounds sized to the filter
		p.MaxMembers, p.MaxTrackedBlocks = sized.MaxMembers, sized.MaxTrackedBlocks
		if p.Seed == nil {
			s := ckf.DefaultSeed
			p.Seed = &s
		}
		if p.BlockSize == 0 {
			p.BlockSize = agreedBlockSize(p.Sources)
		}
		p.KvRelay.withDefaults()
		pools[i] = p
	}
	c.Pools = pools
	return c
}

// shareOf is the default per-client-address share of n slots: a quarter,
// at least one (docs/RATIONALE.md, "Why does one client address get only a
// quarter of the ingest and subscriber slots?").
func shareOf(n int) int { return max(1, n/4) }

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Validate checks a defaulted configuration.
func (c Config) Validate() error {
	if len(c.Pools) == 0 {
		return invalid("no pools configured")
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return invalid("tls_cert_file and tls_key_file must be set together")
	}
	switch {
	case c.MaxFrameBytes < 1<<16:
		return invalid("max_frame_bytes %d < 65536", c.MaxFrameBytes)
	case c.MaxRequestBytes < 1<<10:
		return invalid("max_request_bytes %d < 1024", c.MaxRequestBytes)
	case c.MaxEventsPerBatch < 1, c.MaxBlocksPerEvent < 1, c.MaxSubscribers < 1, c.SubscriberQueue < 1,
		c.SubscriberQueueBytes < 1, c.SnapshotGenerations < 1:
		return invalid("limits must be ≥ 1")
	case c.MaxSubscribersPerClient < 1 || c.MaxSubscribersPerClient > c.MaxSubscribers:
		return invalid("max_subscribers_per_client %d outside 1..max_subscribers (%d)", c.MaxSubscribersPerClient, c.MaxSubscribers)
	case c.MaxLeaseRecords < c.MaxSubscribers:
		return invalid("max_lease_records %d < max_subscribers %d", c.MaxLeaseRecords, c.MaxSubscribers)
	case c.HeartbeatInterval <= 0 || c.ShutdownGrace <= 0 || c.StreamWriteTimeout <= 0:
		return invalid("heartbeat_interval, shutdown_grace and stream_write_timeout must be > 0")
	case c.MaxConcurrentIngest < 1, c.MaxConnections < 1, c.MinBodyRate < 1, c.MaxIdlePerClient < 1:
		return invalid("max_concurrent_ingest, max_connections, max_idle_per_client and min_body_rate must be ≥ 1")
	case c.MaxConcurrentIngestPerClient < 1 || c.MaxConcurrentIngestPerClient > c.MaxConcurrentIngest:
		return invalid("max_concurrent_ingest_per_client %d outside 1..max_concurrent_ingest (%d)", c.MaxConcurrentIngestPerClient, c.MaxConcurrentIngest)
	case c.ReadHeaderTimeout <= 0 || c.BodyReadTimeout <= 0 || c.BodyStartTimeout <= 0 || c.IdleTimeout <= 0 || c.MaxLeaseEpochLead <= 0 || c.StreamStallTimeout <= 0:
		return invalid("read_header_timeout, body_start_timeout, body_read_timeout, idle_timeout, max_lease_epoch_lead and stream_stall_timeout must be > 0")
	case c.AuthToken != "" && c.AuthTokenFile != "":
		return invalid("auth_token and auth_token_file are exclusive")
	}
	if err := c.NATS.validate(); err != nil {
		return err
	}
	if err := c.GRPC.validate(); err != nil {
		return err
	}
	if err := c.HA.validate(c); err != nil {
		return err
	}
	names := map[string]bool{}
	pools := map[ckf.PoolID]string{}
	for _, p := range c.Pools {
		if !poolName.MatchString(p.Name) {
			return invalid("pool name %q must match %s", p.Name, poolName)
		}
		if names[p.Name] {
			return invalid("duplicate pool name %q", p.Name)
		}
		id := ckf.PoolID{Domain: c.PoolDomain(p), DCID: p.DCID}
		if other, dup := pools[id]; dup {
			return invalid("pool %q: dc_id %d in the indexer domain of pool %q: pools of one data center need different cache_semantics or routing_scope", p.Name, p.DCID, other)
		}
		names[p.Name], pools[id] = true, p.Name
		if err := p.ckfConfig().Validate(); err != nil {
			return invalid("pool %q: %v", p.Name, err)
		}
		if p.PublicationDelay <= 0 {
			return invalid("pool %q: publication_delay must be > 0", p.Name)
		}
		if err := p.KvRelay.validate(p.Name); err != nil {
			return err
		}
		if p.HashFormat != HashFormatStandard && p.HashFormat != HashFormatEagle {
			return invalid("pool %q: hash_format %q: want %q or %q", p.Name, p.HashFormat, HashFormatStandard, HashFormatEagle)
		}
		if p.BlockSize < 0 {
			return invalid("pool %q: block_size must be ≥ 0", p.Name)
		}
		for i, src := range p.Sources {
			if p.BlockSize > 0 && src.BlockSize != 0 && src.BlockSize != p.BlockSize {
				return invalid("pool %q: source %d: block_size %d differs from the pool's %d", p.Name, i, src.BlockSize, p.BlockSize)
			}
		}
	}
	return nil
}

// ResolveAuthToken reads AuthTokenFile into AuthToken (trimming surrounding
// whitespace) and clears AuthTokenFile. An unreadable or empty file is an
// error: a relay must not start open because its secret went missing.
func (c Config) ResolveAuthToken() (Config, error) {
	if c.AuthTokenFile == "" {
		return c, nil
	}
	if c.AuthToken != "" {
		return c, invalid("auth_token and auth_token_file are exclusive")
	}
	b, err := os.ReadFile(c.AuthTokenFile)
	if err != nil {
		return c, invalid("auth_token_file: %v", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return c, invalid("auth_token_file %s is empty", c.AuthTokenFile)
	}
	c.AuthToken, c.AuthTokenFile = tok, ""
	return c, nil
}

// Format returns the filter layout (seed, bucket count) a defaulted pool
// publishes: what a router's consumer manifest must name for it.
func (p PoolSpec) Format() (ckf.Format, error) { return p.ckfConfig().Format() }

func (p PoolSpec) ckfConfig() ckf.Config {
	cfg := ckf.DefaultConfig()
	cfg.ExpectedBlocks = p.ExpectedBlocks
	if p.Seed != nil {
		cfg.Seed = *p.Seed
	}
	cfg.MaxKicks = p.MaxKicks
	cfg.PublishEveryNEvents = p.PublishEveryNEvents
	cfg.MaxMembers, cfg.MaxTrackedBlocks = p.MaxMembers, p.MaxTrackedBlocks
	cfg.ApplyWorkers = p.ApplyWorkers
	return cfg
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
}

// Domain returns the routing domain the configuration names.
func (c Config) Domain() ckf.Domain {
	return ckf.Domain{CacheSemantics: scopedDigest(c.CacheSemantics), RoutingScope: scopedDigest(c.RoutingScope)}
}

// PoolDomain returns pool p's indexer domain: its own cache_semantics and
// routing_scope where set, else the relay's.
func (c Config) PoolDomain(p PoolSpec) ckf.Domain {
	d := c.Domain()
	if p.CacheSemantics != "" {
		d.CacheSemantics = scopedDigest(p.CacheSemantics)
	}
	if p.RoutingScope != "" {
		d.RoutingScope = scopedDigest(p.RoutingScope)
	}
	return d
}

// DefaultDomainName is hashed for a domain digest left unset.
const DefaultDomainName = "ckfrelay/default"

func scopedDigest(name string) ckf.ScopedDigest {
	src := ckf.DigestExplicit
	if name == "" {
		name, src = DefaultDomainName, ckf.DigestDefaultDerived
	}
	return ckf.ScopedDigest{Digest: xxh3.HashString128(name).Bytes(), Source: src}
}

// LoadConfigFile reads a JSON configuration file. Unknown keys are errors, so
// a misspelt limit is never silently ignored.
func LoadConfigFile(path string) (Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return Config{}, err
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields()
	var c Config
	if err := dec.Decode(&c); err != nil {
		return Config{}, invalid("%s: %v", path, err)
	}
	return c, nil
}

// ParsePoolFlag parses the --pool flag form
// "name:dc=1,expected=1048576,seed=0x5DEE…,cadence=16,delay=1ms,kicks=500,members=16384,tracked=8388608,workers=2,block_size=16,hash_format=dynamo_standard_v1,cache_semantics=llama,routing_scope=prod";
// every key but dc is optional.
func ParsePoolFlag(s string) (PoolSpec, error) {
	name, rest, _ := strings.Cut(s, ":")
	p := PoolSpec{Name: name}
	seenDC := false
	err := parseKeyValues(fmt.Sprintf("pool %q", name), rest, func(k, v string) (err error) {
		switch k {
		case "dc":
			p.DCID, err = strconv.ParseUint(v, 0, 64)
			seenDC = true
		case "expected":
			p.ExpectedBlocks, err = strconv.ParseUint(v, 0, 64)
		case "seed":
			var s uint64
			s, err = strconv.ParseUint(v, 0, 64)
			p.Seed = &s
		case "cadence":
			p.PublishEveryNEvents, err = strconv.ParseUint(v, 0, 64)
		case "delay":
			var d time.Duration
			d, err = time.ParseDuration(v)
			p.PublicationDelay = Duration(d)
		case "kicks":
			p.MaxKicks, err = strconv.Atoi(v)
		case "members":
			p.MaxMembers, err = strconv.Atoi(v)
		case "tracked":
			p.MaxTrackedBlocks, err = strconv.ParseUint(v, 0, 64)
		case "workers":
			p.ApplyWorkers, err = strconv.Atoi(v)
		case "block_size":
			p.BlockSize, err = strconv.Atoi(v)
		case "hash_format":
			p.HashFormat = v
		case "cache_semantics":
			p.CacheSemantics = v
		case "routing_scope":
			p.RoutingScope = v
		default:
			return errUnknownKey
		}
		return err
	})
	if err != nil {
		return PoolSpec{}, err
	}
	if !seenDC {
		return PoolSpec{}, invalid("pool %q: dc=<id> is required", name)
	}
	return p, nil
}

// errUnknownKey is what a parseKeyValues setter returns for a key it does
// not know.
var errUnknownKey = errors.New("unknown key")

// parseKeyValues parses the "k=v,k=v" tail of a --pool or --source flag
// (empty is no pairs), calling set for each pair in order; what names the
// flag in errors, which wrap [ErrInvalidConfig].
func parseKeyValues(what, rest string, set func(k, v string) error) error {
	if rest == "" {
		return nil
	}
	for _, kv := range strings.Split(rest, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return invalid("%s: %q is not key=value", what, kv)
		}
		if err := set(k, v); errors.Is(err, errUnknownKey) {
			return invalid("%s: unknown key %q", what, k)
		} else if err != nil {
			return invalid("%s: %s: %v", what, k, err)
		}
	}
	return nil
}
